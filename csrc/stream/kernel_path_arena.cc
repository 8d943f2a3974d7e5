// The kernel path's staging arena (issue #38, item 1: the symmetric pool as the one-sided kernel's
// staging area; COMMLIB_DEVICE_STAGING=pool, the default). A one-sided call whose buffers some rank
// cannot share (no shareable handle: staged on every rank, StreamEngine::agree_route) copies them
// once into this rank's arena, and its peers read and write them there in place, as they would the
// slots area; the arena is symmetric memory of the kind the symmetric pool hands out (allocate()'s,
// shared with the registry of peers' buffers as the pool's arenas are, device/peer_buffers.h).
//
// Why not the slots: the slots area is where peers' message plans send their chunks, so a launch
// staged there must end with one more handshake per block with every peer before any rank's next
// launch may send into it (kernel_path_one_sided.cc), and it bounds what can be staged at
// COMMLIB_DEVICE_SLOTS x COMMLIB_DEVICE_SLOT_BYTES per peer. The arena is the one-sided calls'
// alone: no message lands there, and the verifier proves that when a schedule returns every peer is
// done with this rank's buffers (the mapped path ends on the same proof), so a launch staged in the
// arena ends with its last wait, P - 1 handshakes per block fewer; and it grows to any call.
//
// Growth. Every rank makes the same calls, the one-sided shapes are symmetric and the staged bytes
// a function of the shape (stage_layout), so every rank finds its arena too small at the same call
// and grows it to the same size (twice the old one at least, so a few growths reach any size).
// Its share is exchanged through the registry's call ring as buffer kArenaBuffer of a one-sided
// call number of its own (PeerBuffers::agree_arena: one host wait for every peer, at a growth
// only); the peers import it once. An arena grown out of stays allocated and mapped until the
// engine closes (a launch still queued may read it; freeing it here, inside an enqueue, would wait
// for the device), and is freed then as the region is, only once every peer closed its imports.
// Captured calls keep the slots: a graph's replays must not read an arena a later growth retired.
// If some rank cannot allocate or share an arena, every rank reads the same empty share and turns
// pool staging off: the slots path runs from then on, refused by name where it does not fit.
#include <algorithm>
#include <stdexcept>

#include "kernels/plan_kernel.cuh"
#include "stream/kernel_path.h"

namespace commlib {

namespace {
constexpr unsigned kArenaBuffer = 2;  // the ring's buffer index of the arena's share (0, 1: input, output)
constexpr uint64_t kArenaGrain = 64 << 10;
constexpr uint64_t kArenaMinBytes = 1 << 20;
}  // namespace

uint64_t KernelPath::staging_need(const ScheduleKey& key) const {
  auto it = plans_.find(key);
  if (it != plans_.end()) return it->second.stage_need;
  Uploaded u;
  stage_layout(key, u);
  return u.stage_need;
}

bool KernelPath::grow_arena(uint64_t need, uint64_t call, const std::function<bool()>& stop) {
  if (!pool_staging_ || !need) return false;
  if (pool_holds(need)) return true;
  const uint64_t bytes = (std::max({need, 2 * arena_.bytes, kArenaMinBytes}) + kArenaGrain - 1) / kArenaGrain * kArenaGrain;
  char* base = nullptr;
  try {
    base = static_cast<char*>(device_->allocate(bytes));
  } catch (const std::exception&) {  // out of memory here: share nothing, every rank falls back alike
    base = nullptr;
  }
  std::vector<char*> peers;
  bool every = false;
  try {
    every = peer_buffers_->agree_arena(call, kArenaBuffer, base, bytes, stop, &peers);
  } catch (...) {
    if (base) retired_arenas_.push_back(base);  // a peer may have mapped it meanwhile
    throw;
  }
  if (!every) {
    if (base) retired_arenas_.push_back(base);
    pool_staging_ = false;  // on every rank: the same entries read
    return false;
  }
  if (arena_.base) retired_arenas_.push_back(arena_.base);
  arena_ = Arena{base, bytes, std::move(peers)};
  return true;
}

void KernelPath::fill_arena_staged(kexec::PlanLaunch& a, const Uploaded& u, char* const bases[3],
                                   DeviceStream& stream) {
  // As the slots' staging (fill_one_sided): input at 0, the output after it (at 0 in place), every
  // rank's at the same offsets of its arena; the table uploaded once per set of addresses.
  const uint8_t in_bit = 1u << static_cast<int>(BufferId::Input), out_bit = 1u << static_cast<int>(BufferId::Output);
  std::vector<uint64_t> words(static_cast<size_t>(size_) * 3, 0);
  for (int q = 0; q < size_; ++q) {
    words[q * 3 + 0] = (u.peer_bufs & in_bit) ? reinterpret_cast<uint64_t>(arena_.peers[q]) : 0;
    words[q * 3 + 1] = (u.peer_bufs & out_bit) ? reinterpret_cast<uint64_t>(arena_.peers[q] + u.stage_out_at) : 0;
  }
  a.peer_bases = mapped_table(words, stream);
  a.staged_release = 0;  // the arena is no message's: the schedule's last wait ends every peer's use
  if (u.stage_bytes[0] || u.stage_in_place) {
    a.stage_user[0] = bases[0];
    a.stage_bytes[0] = u.stage_bytes[0];
    a.bases[0] = arena_.base;
  }
  if (u.stage_bytes[1] || u.stage_in_place) {
    a.stage_user[1] = bases[1];
    a.stage_bytes[1] = u.stage_bytes[1];
    a.bases[1] = arena_.base + u.stage_out_at;
  }
}

}  // namespace commlib
