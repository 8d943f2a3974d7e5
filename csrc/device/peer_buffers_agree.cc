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

void PeerBuffers::wait_entries(uint64_t call, unsigned first, unsigned n, const std::function<bool()>& stop,
                               std::vector<RingTag>* tags) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(timeout_s_);
  for (unsigned w = 0; w < n; ++w) tags[w].assign(size_, RingTag{});
  for (int p = 0; p < size_; ++p) {
    if (p == rank_) continue;
    if (!peers_[p]) throw std::logic_error("peer buffers: agree() with a peer not mapped");
    for (unsigned w = 0; w < n; ++w) {
      int got;
      for (unsigned spin = 0; (got = read_ring(p, call, first + w, &tags[w][p], Ring::Agreed)) == 0; ++spin) {
        if (stop && stop()) throw std::runtime_error("peer buffers: stopped while waiting for rank " + std::to_string(p));
        // A closing peer makes no call any more: its entry never comes. (Read once more: it wrote
        // its entries before it marked its table, so an entry of a call it made is seen now.)
        if (peers_[p]->closing.load(std::memory_order_acquire)) {
          if ((got = read_ring(p, call, first + w, &tags[w][p], Ring::Agreed)) != 0) break;
          throw PeerClosing(p, "rank " + std::to_string(p) + " is closing its communicator: it never reaches call " +
                                   std::to_string(call) + " of the one-sided calls rank " + std::to_string(rank_) +
                                   " waits in");
        }
        if (std::chrono::steady_clock::now() > deadline)
          throw std::runtime_error("rank " + std::to_string(p) + " did not reach call " + std::to_string(call) +
                                   " of the one-sided calls within the timeout (" + std::to_string(timeout_s_) +
                                   " s): rank " + std::to_string(rank_) + " waited for its buffer's registration");
        back_off(spin);
      }
      // Every rank agrees on every such call, so no peer runs kRing of them ahead: an entry of a later
      // call is a peer's fault (its numbering not this rank's), refused as one (session 32: a
      // logic_error, which reached the caller without the collective's name).
      if (got < 0)
        throw std::runtime_error("rank " + std::to_string(p) + "'s entry of one-sided call " + std::to_string(call) +
                                 " holds a later call's (its one-sided calls numbered apart from rank " +
                                 std::to_string(rank_) + "'s); refused");
    }
  }
  ++stats_.waits;
}

void PeerBuffers::mark_closing() {
  std::lock_guard<std::mutex> lk(mu_);
  if (mine_) mine_->closing.store(1, std::memory_order_release);  // after every entry this rank wrote
}

void PeerBuffers::back_off(unsigned spin) {
  // Spin, then yield, then sleep, as the done word's wait (stream_works.cc): a peer reaches the
  // call within microseconds of this rank in a steady loop, and a 20 us sleep costs 60-100 us on
  // Linux (the timer's slack and the wake-up), which every mapped call paid when it slept once.
  if (spin > kAgreeYields) {
    ++stats_.agree_sleeps;
    std::this_thread::sleep_for(std::chrono::microseconds(20));
  } else if (spin > kAgreeSpins) {
    std::this_thread::yield();
  }
}

PeerBufferTag PeerBuffers::agreed_tag(const void* ptr, size_t bytes, uint32_t* slot, Device::MemoryRange* range) {
  if (!ptr) return PeerBufferTag{};  // no buffer of this rank (an in-place all_to_all's input): every rank stages
  const char* p = static_cast<const char*>(ptr);
  // A symmetric pool's block: its arena is this registry's (share_arena) and lives until unmap_arena
  // took it out of arenas_, so its tag is known without asking the driver.
  for (const Arena& a : arenas_)
    if (a.own.id && p >= a.base && p + bytes <= a.base + a.bytes) {
      *slot = a.own.slot;
      return PeerBufferTag{a.own.id, static_cast<uint64_t>(p - a.base)};
    }
  // The output inside the allocation the input's query just found (in place, or one buffer's two
  // halves): the same allocation at this instant, so no second query.
  if (!range->bytes || p < range->base || p + bytes > range->base + range->bytes) *range = device_->memory_range(ptr);
  return register_own(ptr, bytes, false, slot, range);
}

char* PeerBuffers::checked_mapping(int p, const RingTag& t, uint64_t call, const char* what) {
  char* base = mapped(p, t, false);
  if (!base)
    throw std::runtime_error("rank " + std::to_string(rank_) + " cannot map rank " + std::to_string(p) + "'s " + what +
                             " of one-sided call " + std::to_string(call) +
                             " (freed while the call was enqueued, or a slot past its table: " + std::to_string(t.slot) +
                             ")");
  // Trust nothing a peer says (session 32): its entry's extent must lie in the allocation its
  // segment registered, or a launch through the mapping reads and writes outside the peer's buffer.
  const uint64_t held = imports_[p][t.slot].bytes;
  if (!imports_[p][t.slot].holds(t.tag.offset, t.bytes))
    throw std::runtime_error("rank " + std::to_string(p) + "'s " + what + " of one-sided call " + std::to_string(call) +
                             " is out of range: offset " + std::to_string(t.tag.offset) + " + " +
                             std::to_string(t.bytes) + " bytes in an allocation of " + std::to_string(held) +
                             "; refused by rank " + std::to_string(rank_));
  return base;
}

bool PeerBuffers::agree(uint64_t call, const void* in, size_t in_bytes, const void* out, size_t out_bytes,
                        const std::function<bool()>& stop, PeerBufferView* in_view, PeerBufferView* out_view) {
  std::lock_guard<std::mutex> lk(mu_);
  PeerBufferView* views[2] = {in_view, out_view};
  open_call(0, false, *in_view);
  out_view->peer.assign(size_, nullptr);
  out_view->expect.assign(size_, PeerBufferTag{});
  // Both buffers' entries written before any peer's is read: one wait for the slowest peer per call
  // (two before, one per buffer, each a round of every rank's host).
  Device::MemoryRange range{};
  uint32_t slots[2] = {0, 0};
  in_view->own = agreed_tag(in, in_bytes, &slots[0], &range);
  out_view->own = agreed_tag(out, out_bytes, &slots[1], &range);
  write_ring(call, 0, in_view->own, slots[0], Ring::Agreed, in_bytes);
  write_ring(call, 1, out_view->own, slots[1], Ring::Agreed, out_bytes);
  wait_entries(call, 0, 2, stop, agree_tags_);
  bool every = in_view->own.id != 0 && out_view->own.id != 0;
  for (int p = 0; p < size_; ++p)
    every = every && (p == rank_ || (agree_tags_[0][p].tag.id != 0 && agree_tags_[1][p].tag.id != 0));
  if (!every) return false;
  for (unsigned w = 0; w < 2; ++w)
    for (int p = 0; p < size_; ++p) {
      if (p == rank_) continue;
      const RingTag& t = agree_tags_[w][p];
      char* base = checked_mapping(p, t, call, w == 0 ? "input" : "output");
      views[w]->peer[p] = base + t.tag.offset;
      views[w]->expect[p] = t.tag;
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
  write_ring(call, which, own, slot, Ring::Agreed, bytes);
  std::vector<RingTag> tags[1];
  wait_entries(call, which, 1, stop, tags);
  bool every = own.id != 0;
  for (int p = 0; p < size_; ++p) every = every && (p == rank_ || tags[0][p].tag.id != 0);
  if (!every) return false;
  peers->assign(size_, nullptr);
  (*peers)[rank_] = static_cast<char*>(const_cast<void*>(base));
  for (int p = 0; p < size_; ++p) {
    if (p == rank_) continue;
    // imported once, kept until retired (close_arena_imports) or close
    char* mapping = checked_mapping(p, tags[0][p], call, "staging arena");
    if (tags[0][p].tag.offset != 0 || tags[0][p].bytes < bytes)  // (the start of an allocation, as large)
      throw std::runtime_error("rank " + std::to_string(p) + "'s staging arena of call " + std::to_string(call) +
                               " is not the agreed one: offset " + std::to_string(tags[0][p].tag.offset) + ", " +
                               std::to_string(tags[0][p].bytes) + " bytes (" + std::to_string(bytes) +
                               " agreed); refused by rank " + std::to_string(rank_));
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
