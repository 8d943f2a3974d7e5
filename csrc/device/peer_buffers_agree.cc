// PeerBuffers::agree (peer_buffers.h): the exact lookup the kernel path's one-sided calls take,
// so that every rank chooses the same route (peers' buffers in place, or the staged path); and
// the kernel path's staging arenas, shared (agree_arena) and retired (arenas_done).
//
// Why every rank answers alike: each rank writes its own tag of the call into its ring before it
// reads any peer's, and waits until it has read every peer's entry of the call; the answer is
// "every rank's tag is registered", a function of the same entries on every rank. lookup's
// prediction is not used here: a prediction is one rank's guess, which another rank cannot know.
// Its entries go into a ring of their own (Shared::agreed), apart from lookup's, whose call numbers
// are its caller's: the two numberings never overwrite or answer each other.
#include <chrono>
#include <stdexcept>
#include <string>
#include <thread>

#include "device/peer_buffers.h"
#include "device/peer_buffers_table.h"

namespace commlib {

void PeerBuffers::wait_entries(uint64_t call, unsigned which, const std::function<bool()>& stop,
                               std::vector<RingTag>& tags) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(timeout_s_);
  tags.assign(size_, RingTag{});
  for (int p = 0; p < size_; ++p) {
    if (p == rank_) continue;
    if (!peers_[p]) throw std::logic_error("peer buffers: agree() with a peer not mapped");
    int got;
    for (unsigned spin = 0; (got = read_ring(p, call, which, &tags[p], Ring::Agreed)) == 0; ++spin) {
      if (stop && stop()) throw std::runtime_error("peer buffers: stopped while waiting for rank " + std::to_string(p));
      if (std::chrono::steady_clock::now() > deadline)
        throw std::runtime_error("rank " + std::to_string(p) + " did not reach call " + std::to_string(call) +
                                 " of the one-sided calls within the timeout (" + std::to_string(timeout_s_) +
                                 " s): rank " + std::to_string(rank_) + " waited for its buffer's registration");
      if (spin > 64) std::this_thread::sleep_for(std::chrono::microseconds(20));
    }
    if (got < 0)  // every rank agrees on every such call, so no peer runs kRing of them ahead
      throw std::logic_error("peer buffers: rank " + std::to_string(p) + "'s entry of call " + std::to_string(call) +
                             " was overwritten");
  }
  ++stats_.waits;
}

bool PeerBuffers::agree(uint64_t call, unsigned which, const void* ptr, size_t bytes, bool captured,
                        const std::function<bool()>& stop, PeerBufferView* view) {
  std::lock_guard<std::mutex> lk(mu_);
  PeerBufferView& v = *view;
  open_call(which, captured, v);
  uint32_t slot = 0;
  // Captured: an empty tag (no export or import may run), so every rank stages this call.
  v.own = captured ? PeerBufferTag{} : register_own(ptr, bytes, false, &slot);
  write_ring(call, which, v.own, slot, Ring::Agreed);
  std::vector<RingTag> tags;
  wait_entries(call, which, stop, tags);
  bool every = v.own.id != 0;
  for (int p = 0; p < size_; ++p) every = every && (p == rank_ || tags[p].tag.id != 0);
  if (!every) return false;
  for (int p = 0; p < size_; ++p) {
    if (p == rank_) continue;
    char* base = mapped(p, tags[p], false);
    if (!base)
      throw std::runtime_error("rank " + std::to_string(rank_) + " cannot map rank " + std::to_string(p) +
                               "'s registered buffer of a one-sided call (freed while the call was enqueued?)");
    v.peer[p] = base + tags[p].tag.offset;
    v.expect[p] = tags[p].tag;
  }
  return true;
}

bool PeerBuffers::agree_arena(uint64_t call, unsigned which, const void* base, size_t bytes,
                              const std::function<bool()>& stop, std::vector<char*>* peers) {
  std::lock_guard<std::mutex> lk(mu_);
  PeerBufferView v;
  open_call(which, false, v);
  uint32_t slot = 0;
  // A rank that could not allocate one shares nothing (id 0): then no rank stages in its arena.
  const PeerBufferTag own = base ? register_own(base, bytes, false, &slot) : PeerBufferTag{};
  if (own.id && own.offset != 0) throw std::invalid_argument("base: not the start of an allocation");
  write_ring(call, which, own, slot, Ring::Agreed);
  std::vector<RingTag> tags;
  wait_entries(call, which, stop, tags);
  bool every = own.id != 0;
  for (int p = 0; p < size_; ++p) every = every && (p == rank_ || tags[p].tag.id != 0);
  if (!every) return false;
  peers->assign(size_, nullptr);
  (*peers)[rank_] = static_cast<char*>(const_cast<void*>(base));
  for (int p = 0; p < size_; ++p) {
    if (p == rank_) continue;
    char* mapping = mapped(p, tags[p], false);  // imported once, kept until retired (close_arena_imports) or close
    if (!mapping)
      throw std::runtime_error("rank " + std::to_string(rank_) + " cannot map rank " + std::to_string(p) +
                               "'s staging arena (its handle refused)");
    (*peers)[p] = mapping;
  }
  return true;
}

void PeerBuffers::close_arena_imports(const std::vector<char*>& peers) {
  std::lock_guard<std::mutex> lk(mu_);
  for (int p = 0; p < size_ && p < static_cast<int>(peers.size()); ++p) {
    if (p == rank_ || !peers[p]) continue;
    for (Import& imp : imports_[p])
      if (imp.base == peers[p]) {
        device_->close_import(imp.base);
        imp = Import{};
        ++stats_.closed;
        break;
      }
  }
}

void PeerBuffers::retire_arena(const void* base) {
  std::lock_guard<std::mutex> lk(mu_);
  retire(static_cast<char*>(const_cast<void*>(base)));
}

void PeerBuffers::publish_arenas_done(uint64_t bits) {
  if (mine_) mine_->arenas_done.fetch_or(bits, std::memory_order_release);
}

uint64_t PeerBuffers::arenas_done(int p) const {
  const Shared* t = p == rank_ ? mine_ : peers_[p];
  return t ? t->arenas_done.load(std::memory_order_acquire) : 0;
}

}  // namespace commlib
