// PeerBuffers' symmetric arenas (peer_buffers.h): the symmetric pool's memory
// (commlib/device/symmetric.py) registered and mapped when the pool allocates it, so that a call
// on a pool block finds every peer's block mapped already (no wait, no prediction to learn) and
// the pool's release unmaps it on every rank before any rank frees it.
//
// Why through this registry and not a mapping of the pool's own: a process may open a CUDA IPC
// handle once (a second cudaIpcOpenMemHandle of the same allocation in one context fails), so the
// pool's mapping and the kernel path's must be one; here the arena is an ordinary registration
// (segment slot, import cached per slot), so agree() and lookup() of any call reuse it.
#include <stdexcept>
#include <string>

#include "device/peer_buffers.h"

namespace commlib {

PeerBuffers::ArenaShare PeerBuffers::share_arena(const void* base, size_t bytes) {
  std::lock_guard<std::mutex> lk(mu_);
  if (!mine_) throw std::logic_error("peer buffers: closed");
  const Device::MemoryRange r = device_->memory_range(base);
  if (r.base != static_cast<const char*>(base))
    throw std::invalid_argument("base: not the start of an allocation of " + device_->name());
  uint32_t slot = 0;
  const PeerBufferTag t = register_own(base, bytes, false, &slot);
  return t.id ? ArenaShare{t.id, slot} : ArenaShare{};
}

void PeerBuffers::map_arena(const void* base, size_t bytes, const std::vector<ArenaShare>& every) {
  std::lock_guard<std::mutex> lk(mu_);
  if (!mine_) throw std::logic_error("peer buffers: closed");
  if (every.size() != static_cast<size_t>(size_))
    throw std::invalid_argument("every: one share per rank (" + std::to_string(size_) + "), got " +
                                std::to_string(every.size()));
  for (int p = 0; p < size_; ++p) {
    if (p == rank_ || !peers_[p] || !every[p].id) continue;  // another host, or unshareable there: staged
    if (!mapped(p, RingTag{PeerBufferTag{every[p].id, 0}, every[p].slot, 0}, false))
      throw std::runtime_error("peer buffers: rank " + std::to_string(rank_) + " cannot map rank " +
                               std::to_string(p) + "'s symmetric arena (freed, or its handle refused)");
  }
  arenas_.push_back(Arena{static_cast<const char*>(base), bytes, every[rank_], every});
}

void PeerBuffers::unmap_arena(const void* base) {
  std::lock_guard<std::mutex> lk(mu_);
  for (size_t i = 0; i < arenas_.size(); ++i) {
    const Arena& a = arenas_[i];
    if (a.base != static_cast<const char*>(base)) continue;
    for (int p = 0; p < size_; ++p) {
      if (p == rank_ || !a.every[p].id || a.every[p].slot >= kSegments) continue;
      Import& imp = imports_[p][a.every[p].slot];
      if (imp.base && imp.id == a.every[p].id) {
        device_->close_import(imp.base);
        imp = Import{};
        ++stats_.closed;
      }
    }
    retire(const_cast<char*>(a.base));
    arenas_.erase(arenas_.begin() + static_cast<std::ptrdiff_t>(i));
    return;
  }
}

size_t PeerBuffers::arenas() const {
  std::lock_guard<std::mutex> lk(mu_);
  return arenas_.size();
}

bool PeerBuffers::arena_view(uint64_t call, unsigned which, const void* ptr, size_t bytes, bool captured,
                             PeerBufferView& v) {
  const char* p = static_cast<const char*>(ptr);
  for (const Arena& a : arenas_) {
    if (p < a.base || p + bytes > a.base + a.bytes || !a.own.id) continue;
    const uint64_t offset = static_cast<uint64_t>(p - a.base);
    v.own = PeerBufferTag{a.own.id, offset};
    write_ring(call, which, v.own, a.own.slot, Ring::Lookup, bytes);  // the peers' lookups read it as any other
    for (int q = 0; q < size_; ++q) {
      if (q == rank_ || !peers_[q] || !a.every[q].id) continue;
      const RingTag t{PeerBufferTag{a.every[q].id, offset}, a.every[q].slot, 0};
      if (char* base = mapped(q, t, captured)) {  // imported at map_arena: a cached import, no driver call
        v.peer[q] = base + offset;
        v.expect[q] = t.tag;  // checked by the kernel against q's descriptor, as a prediction is
      }
    }
    ++stats_.hits;
    ++stats_.arena_hits;
    return true;
  }
  return false;
}

}  // namespace commlib
