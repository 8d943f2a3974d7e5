// The kernel path's words the host reads and sets (see kernel_path.h): the host page (abort word,
// completion words, progress, the call check's mismatch record), the blocks' chunk counts (device
// memory) and the test hook that moves the pairs' chunk numbers.
#include <cstring>
#include <stdexcept>

#include "device/host_flags.h"
#include "kernels/plan_launch.cuh"
#include "plan/describe.h"
#include "stream/kernel_path.h"

namespace commlib {

using namespace kernel_page;

bool KernelPath::mismatch(std::string* message) const {
  if (!host_page_) return false;
  const uint64_t* w = reinterpret_cast<const uint64_t*>(host_page_) + kMismatchWord;
  const uint64_t peer = load_flag(w);  // acquire: the record's words were written before it
  if (peer == 0) return false;
  uint64_t words[6];
  for (int i = 0; i < 6; ++i) words[i] = load_flag(w + 1 + i);
  CallDesc mine, theirs;
  std::memcpy(&mine, words, sizeof mine);
  std::memcpy(&theirs, words + 3, sizeof theirs);
  *message = mismatch_message(rank_, mine, static_cast<int>(peer - 1), theirs);
  return true;
}

void KernelPath::abort() {
  if (host_page_) store_flag(reinterpret_cast<uint64_t*>(host_page_), 1);
}

uint64_t KernelPath::replays_done() const {
  return host_page_ ? load_flag(reinterpret_cast<const uint64_t*>(host_page_) + kReplaysDoneWord) : 0;
}

bool KernelPath::replay_running() const {
  if (!host_page_) return false;
  const uint64_t* w = reinterpret_cast<const uint64_t*>(host_page_);
  return load_flag(w + kReplaysStartedWord) > load_flag(w + kReplaysDoneWord);
}

uint64_t KernelPath::progress() const {
  if (!host_page_) return 0;
  uint64_t sum = 0;
  const uint64_t* w = reinterpret_cast<const uint64_t*>(host_page_) + kProgressWord;
  for (unsigned b = 0; b < kexec::kMaxBlocks; ++b) sum += load_flag(w + b);
  return sum;
}

KernelPath::ChunksMoved KernelPath::chunks_moved() const {
  ChunksMoved out;
  if (!local_) return out;
  // Device memory (the launches' ends only write the host page): copied out, once the launches completed.
  uint64_t w[2 * kexec::kMaxBlocks];
  device_->download_now(w, static_cast<const char*>(local_) + chunk_counts_offset(), sizeof w);
  for (unsigned b = 0; b < kexec::kMaxBlocks; ++b) {
    out.ll += w[2 * b];
    out.slots += w[2 * b + 1];
  }
  return out;
}

void KernelPath::start_chunk_numbers_at(uint64_t n) {
  if (!local_) throw std::logic_error("kernel path: released");
  const std::vector<uint64_t> numbers(2 * static_cast<size_t>(size_), n);  // sent | received
  device_->upload_now(local_, numbers.data(), numbers.size() * sizeof(uint64_t));
  // The flags as if chunks up to n - 1 had gone through the slot protocol: ready[q][s] and
  // freed[p][s] hold the number + 1 of the last chunk before n through slot s (0: none). The LL
  // lines stay as they are, as the slot protocol leaves them.
  std::vector<uint64_t> flags(static_cast<size_t>(size_) * nslots_, 0);
  for (int p = 0; p < size_; ++p)
    for (uint32_t s = 0; s < nslots_; ++s)
      if (n > s) flags[static_cast<size_t>(p) * nslots_ + s] = n - (n - 1 - s) % nslots_;
  device_->upload_now(region_, flags.data(), flags.size() * sizeof(uint64_t));                  // ready
  device_->upload_now(region_ + flag_bytes(), flags.data(), flags.size() * sizeof(uint64_t));   // freed
}

}  // namespace commlib
