// Peers' buffers, mapped (see peer_buffers.h): the segment table and call ring in host memory the
// peers on this host map (a memfd they open through /proc, as the copy path's control region),
// written under seqlocks by their one writer (this process) and read by the peers.
#include "device/peer_buffers.h"
#include "device/peer_buffers_table.h"

#include <cstddef>

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <stdexcept>

namespace commlib {

namespace {

template <class Fill>
void seq_write(std::atomic<uint64_t>& seq, Fill fill) {
  const uint64_t s = seq.load(std::memory_order_relaxed);
  seq.store(s + 1, std::memory_order_relaxed);
  std::atomic_thread_fence(std::memory_order_release);
  fill();
  seq.store(s + 2, std::memory_order_release);
}

// Copies what `read` reads under the seqlock; false when a write overlapped it (read again).
template <class Read>
bool seq_read(const std::atomic<uint64_t>& seq, Read read) {
  const uint64_t s = seq.load(std::memory_order_acquire);
  if (s & 1) return false;
  read();
  std::atomic_thread_fence(std::memory_order_acquire);
  return seq.load(std::memory_order_relaxed) == s;
}

std::string key_of(const PeerBufferTag& t, size_t bytes, unsigned which) {
  return std::to_string(t.id) + ":" + std::to_string(t.offset) + ":" + std::to_string(bytes) + ":" +
         std::to_string(which);
}

}  // namespace

bool PeerBufferView::all_mapped() const {
  size_t n = 0;
  for (char* p : peer) n += p != nullptr;
  return !peer.empty() && n + 1 == peer.size();
}

PeerBuffers::PeerBuffers(std::shared_ptr<Device> device, int rank, int size, double timeout_s)
    : device_(std::move(device)), rank_(rank), size_(size), timeout_s_(timeout_s), peers_(size, nullptr),
      retired_seen_(size, 0), imports_(size, std::vector<Import>(kSegments)) {
  fd_ = memfd_create("commlib-peer-buffers", MFD_CLOEXEC);
  if (fd_ < 0 || ftruncate(fd_, sizeof(Shared)) != 0)
    throw std::runtime_error(std::string("peer buffers: table: ") + std::strerror(errno));
  void* m = mmap(nullptr, sizeof(Shared), PROT_READ | PROT_WRITE, MAP_SHARED, fd_, 0);
  if (m == MAP_FAILED) throw std::runtime_error(std::string("peer buffers: mmap: ") + std::strerror(errno));
  mine_ = static_cast<Shared*>(m);  // zeroed by ftruncate
  for (uint32_t s = kSegments; s-- > 0;) free_slots_.push_back(s);
}

PeerBuffers::~PeerBuffers() {
  try {
    // The last reference may go on any thread: the device current for the imports' closes (no
    // stray context); a device that cannot be made current (a sticky error) keeps them, as the
    // kernel path keeps its regions then.
    DeviceGuard guard(*device_);
    close();
  } catch (...) {
  }
  if (mine_) munmap(mine_, sizeof(Shared));
  if (fd_ >= 0) ::close(fd_);
}

std::string PeerBuffers::local_handle() const { return std::to_string(getpid()) + "." + std::to_string(fd_); }

void PeerBuffers::connect(const std::vector<std::string>& handles, const std::vector<bool>& same_host) {
  for (int p = 0; p < size_; ++p) {
    if (p == rank_ || !same_host[p]) continue;
    const std::string& h = handles[p];
    const size_t dot = h.find('.');
    if (dot == std::string::npos || h.find_first_not_of("0123456789.") != std::string::npos)
      throw std::invalid_argument("peer buffers: malformed handle of rank " + std::to_string(p) + ": '" + h + "'");
    const std::string path = "/proc/" + h.substr(0, dot) + "/fd/" + h.substr(dot + 1);
    const int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) throw std::runtime_error("peer buffers: cannot open rank " + std::to_string(p) + "'s table " + path);
    struct stat st {};
    void* m = MAP_FAILED;
    if (fstat(fd, &st) == 0 && static_cast<size_t>(st.st_size) >= sizeof(Shared))
      m = mmap(nullptr, sizeof(Shared), PROT_READ, MAP_SHARED, fd, 0);
    ::close(fd);
    if (m == MAP_FAILED) throw std::runtime_error("peer buffers: cannot map rank " + std::to_string(p) + "'s table");
    peers_[p] = static_cast<Shared*>(m);
  }
}

void PeerBuffers::retire(char* base) {
  auto it = own_.find(base);
  if (it == own_.end()) return;
  Shared::Segment& seg = mine_->segments[it->second.slot];
  seq_write(seg.seq, [&] { seg.id = 0; });
  mine_->retired.fetch_add(1, std::memory_order_release);
  free_slots_.push_back(it->second.slot);
  own_.erase(it);
  ++stats_.retired;
}

PeerBufferTag PeerBuffers::register_own(const void* ptr, size_t bytes, bool captured, uint32_t* slot,
                                        const Device::MemoryRange* known) {
  const Device::MemoryRange r = known ? *known : device_->memory_range(ptr);
  const char* p = static_cast<const char*>(ptr);
  if (!r.bytes || p + bytes > r.base + r.bytes) return PeerBufferTag{};  // not (all) memory of this device
  auto it = own_.find(r.base);
  if (it != own_.end() && it->second.id == r.buffer_id) {
    *slot = it->second.slot;
    return PeerBufferTag{r.buffer_id, static_cast<uint64_t>(p - r.base)};
  }
  if (captured) return PeerBufferTag{};
  // A new allocation: every registration whose allocation is gone (freed, maybe reused at the same
  // address or inside this one's range) is retired first, so no peer keeps reading through it.
  std::vector<char*> stale;
  for (const auto& [base, own] : own_) {
    const Device::MemoryRange now = device_->memory_range(base);
    if (now.base != base || now.buffer_id != own.id) stale.push_back(base);
  }
  for (char* base : stale) retire(base);
  if (!r.shareable) {
    ++stats_.unshareable;
    return PeerBufferTag{};
  }
  if (free_slots_.empty()) return PeerBufferTag{};
  std::string handle;
  try {
    handle = device_->export_memory(r.base);
  } catch (const std::invalid_argument&) {
    ++stats_.unshareable;
    return PeerBufferTag{};
  }
  if (handle.size() >= peer_table::kHandleBytes)
    throw std::logic_error("peer buffers: a memory handle longer than the table's");
  const uint32_t s = free_slots_.back();
  free_slots_.pop_back();
  Shared::Segment& seg = mine_->segments[s];
  seq_write(seg.seq, [&] {
    seg.id = r.buffer_id;
    seg.bytes = r.bytes;
    std::memset(seg.handle, 0, peer_table::kHandleBytes);
    std::memcpy(seg.handle, handle.data(), handle.size());
  });
  own_[r.base] = Own{s, r.buffer_id, r.bytes};
  ++stats_.registered;
  *slot = s;
  return PeerBufferTag{r.buffer_id, static_cast<uint64_t>(p - r.base)};
}

void PeerBuffers::write_ring(uint64_t call, unsigned which, const PeerBufferTag& tag, uint32_t slot, Ring ring,
                             uint64_t bytes) {
  Shared::Entry& e = (ring == Ring::Agreed ? mine_->agreed : mine_->ring)[(call % kRing) * kBuffersPerCall + which];
  seq_write(e.seq, [&] {
    e.call_plus_one = call + 1;
    e.id = tag.id;
    e.offset = tag.offset;
    e.slot = slot;
    e.bytes = tag.id ? bytes : 0;
  });
}

// 1: found; 0: the peer has not reached the call yet; -1: its entry is gone (overwritten by a
// call kRing later: the peer ran that far ahead).
int PeerBuffers::read_ring(int p, uint64_t call, unsigned which, RingTag* out, Ring ring) const {
  const Shared::Entry& e = (ring == Ring::Agreed ? peers_[p]->agreed : peers_[p]->ring)[(call % kRing) * kBuffersPerCall + which];
  for (unsigned tries = 0;; ++tries) {
    if (tries == 1u << 20) return 0;  // a writer that died mid-write: the caller's timeout decides
    uint64_t c = 0, id = 0, offset = 0, slot = 0, bytes = 0;
    if (!seq_read(e.seq, [&] {
          c = e.call_plus_one;
          id = e.id;
          offset = e.offset;
          slot = e.slot;
          bytes = e.bytes;
        }))
      continue;
    if (c != call + 1) return c > call + 1 ? -1 : 0;
    // (a slot past the table reads as kSegments: mapped() refuses it, not the cast's wrap)
    *out = RingTag{PeerBufferTag{id, offset}, static_cast<uint32_t>(std::min<uint64_t>(slot, kSegments)), call + 1,
                   bytes};
    return 1;
  }
}

char* PeerBuffers::mapped(int p, const RingTag& t, bool captured) {
  if (t.slot >= kSegments) return nullptr;
  Import& imp = imports_[p][t.slot];
  if (imp.base && imp.id == t.tag.id) return imp.base;
  if (captured) return nullptr;  // no IPC call while a capture runs
  if (imp.base) {
    device_->close_import(imp.base);
    imp = Import{};
    ++stats_.closed;
  }
  const Shared::Segment& seg = peers_[p]->segments[t.slot];
  uint64_t id = 0, seq = 0, seg_bytes = 0;
  std::string handle;
  while (!seq_read(seg.seq, [&] {
    seq = seg.seq.load(std::memory_order_relaxed);
    id = seg.id;
    seg_bytes = seg.bytes;
    handle.assign(seg.handle, strnlen(seg.handle, peer_table::kHandleBytes));
  })) {
  }
  if (id != t.tag.id) return nullptr;  // retired (freed) since: never map another allocation for it
  char* base = nullptr;
  try {
    base = static_cast<char*>(device_->import_memory(handle));
  } catch (const std::exception&) {
    return nullptr;  // freed under the handle (CUDA refuses a stale handle): staged
  }
  if (seg.seq.load(std::memory_order_acquire) != seq) {  // retired while we opened it
    device_->close_import(base);
    return nullptr;
  }
  // The segment's size is the peer's word; the mapping's is the driver's. Entries are checked
  // against the smaller (Import::holds), so a peer that claims more than it allocated cannot make a
  // launch reach past the mapping (trust nothing a peer says: docs/gpu.md, session 32's audit).
  const uint64_t real = device_->imported_bytes(base);
  if (real) seg_bytes = std::min<uint64_t>(seg_bytes, real);
  imp = Import{t.tag.id, base, seg_bytes};
  ++stats_.imported;
  return base;
}

void PeerBuffers::close_retired(int p) {
  const uint64_t now = peers_[p]->retired.load(std::memory_order_acquire);
  if (now == retired_seen_[p]) return;
  retired_seen_[p] = now;
  for (uint32_t s = 0; s < kSegments; ++s) {
    Import& imp = imports_[p][s];
    if (!imp.base) continue;
    const Shared::Segment& seg = peers_[p]->segments[s];
    uint64_t id = 0;
    while (!seq_read(seg.seq, [&] { id = seg.id; })) {
    }
    if (id == imp.id) continue;
    device_->close_import(imp.base);
    imp = Import{};
    ++stats_.closed;
  }
}

void PeerBuffers::learn(const std::string& key, int p, const RingTag& t) {
  std::vector<RingTag>& v = predicted_[key];
  v.resize(size_);
  if (v[p].call && !(v[p].tag == t.tag && v[p].slot == t.slot)) ++stats_.mispredicted;
  v[p] = t;
}

void PeerBuffers::check_predictions() {
  std::vector<Pending> keep;
  for (Pending& pd : pending_) {
    bool open = false;
    for (int p = 0; p < size_; ++p) {
      if (p == rank_ || !peers_[p] || !(pd.unresolved & (uint64_t{1} << (p % 64)))) continue;
      RingTag t;
      const int got = read_ring(p, pd.call, pd.which, &t, Ring::Lookup);
      if (got == 0) {
        open = true;
        continue;
      }
      pd.unresolved &= ~(uint64_t{1} << (p % 64));
      if (got == 1) learn(pd.key, p, t);
    }
    if (open) keep.push_back(std::move(pd));
  }
  pending_ = std::move(keep);
}

void PeerBuffers::open_call(unsigned which, bool captured, PeerBufferView& v) {
  if (which >= kBuffersPerCall)
    throw std::invalid_argument("which: a call has at most " + std::to_string(kBuffersPerCall) + " buffers");
  if (!mine_) throw std::logic_error("peer buffers: closed");
  if (!captured)
    for (int p = 0; p < size_; ++p)
      if (p != rank_ && peers_[p]) close_retired(p);
  v.peer.assign(size_, nullptr);
  v.expect.assign(size_, PeerBufferTag{});
}

PeerBufferView PeerBuffers::lookup(uint64_t call, unsigned which, const void* ptr, size_t bytes, bool captured,
                                   const std::function<bool()>& stop) {
  std::lock_guard<std::mutex> lk(mu_);
  PeerBufferView v;
  open_call(which, captured, v);
  check_predictions();
  if (arena_view(call, which, ptr, bytes, captured, v)) return v;  // a symmetric pool's block: mapped already
  uint32_t slot = 0;
  v.own = register_own(ptr, bytes, captured, &slot);
  write_ring(call, which, v.own, slot, Ring::Lookup, bytes);  // the peers learn this rank's buffer of the call from it
  if (!v.own.id) return v;  // not registrable here: the call is staged for this rank
  const std::string key = key_of(v.own, bytes, which);
  auto known = predicted_.find(key);
  const bool hit = known != predicted_.end();
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(timeout_s_);
  Pending pending{call, which, key, 0};
  bool waited = false;
  for (int p = 0; p < size_; ++p) {
    if (p == rank_ || !peers_[p]) continue;
    RingTag t;
    int got = read_ring(p, call, which, &t, Ring::Lookup);
    if (got == 0 && hit && known->second[p].call) {
      t = known->second[p];  // predicted; checked against the ring later, and by the kernel always
      pending.unresolved |= uint64_t{1} << (p % 64);
    } else if (got == 0 && !captured) {  // a miss: p's buffer of this call, from p's ring
      waited = true;
      for (unsigned spin = 0; (got = read_ring(p, call, which, &t, Ring::Lookup)) == 0; ++spin) {
        if (stop && stop()) throw std::runtime_error("peer buffers: stopped while waiting for rank " + std::to_string(p));
        if (std::chrono::steady_clock::now() > deadline)
          throw std::runtime_error("peer buffers: rank " + std::to_string(p) + " did not reach call " +
                                   std::to_string(call) + " within the timeout (" + std::to_string(timeout_s_) +
                                   " s) while rank " + std::to_string(rank_) + " registered a new buffer");
        back_off(spin);  // (a 50 us sleep after 64 spins before session 31: ~100 us a first call)
      }
    }
    if (got == 1) learn(key, p, t);
    if (got != 1 && !(pending.unresolved & (uint64_t{1} << (p % 64)))) continue;  // lost or captured: staged
    if (!t.tag.id) continue;  // p's buffer is not registered: staged
    if (char* base = mapped(p, t, captured)) {
      if (!imports_[p][t.slot].holds(t.tag.offset, bytes)) continue;  // (a peer's extent past its allocation: staged)
      v.peer[p] = base + t.tag.offset;
      v.expect[p] = t.tag;
    }
  }
  if (pending.unresolved) pending_.push_back(std::move(pending));
  ++(hit ? stats_.hits : stats_.misses);  // a miss: this rank's first call with the buffer
  if (waited) ++stats_.waits;
  return v;
}

void PeerBuffers::close() {
  std::lock_guard<std::mutex> lk(mu_);
  for (int p = 0; p < size_; ++p) {
    for (Import& imp : imports_[p])
      if (imp.base) {
        device_->close_import(imp.base);
        imp = Import{};
        ++stats_.closed;
      }
    if (peers_[p]) munmap(peers_[p], sizeof(Shared));
    peers_[p] = nullptr;
  }
  std::vector<char*> bases;
  for (const auto& [base, own] : own_) bases.push_back(base);
  for (char* base : bases) retire(base);
  predicted_.clear();
  pending_.clear();
  arenas_.clear();
}

PeerBuffers::Stats PeerBuffers::stats() const {
  std::lock_guard<std::mutex> lk(mu_);
  return stats_;
}

size_t PeerBuffers::registrations() const {
  std::lock_guard<std::mutex> lk(mu_);
  return own_.size();
}

size_t PeerBuffers::imports() const {
  std::lock_guard<std::mutex> lk(mu_);
  size_t n = 0;
  for (const auto& row : imports_)
    for (const Import& imp : row) n += imp.base != nullptr;
  return n;
}

std::vector<std::pair<std::string, size_t>> PeerBuffers::table_layout() {
  using Segment = Shared::Segment;
  using Entry = Shared::Entry;
  return {{"segments", offsetof(Shared, segments)},      {"segment_bytes", sizeof(Segment)},
          {"segment_count", kSegments},                 {"segment_id", offsetof(Segment, id)},
          {"segment_bytes_field", offsetof(Segment, bytes)}, {"segment_handle", offsetof(Segment, handle)},
          {"ring", offsetof(Shared, ring)},             {"agreed", offsetof(Shared, agreed)},
          {"ring_calls", kRing},                        {"buffers_per_call", kBuffersPerCall},
          {"entry_bytes", sizeof(Entry)},               {"entry_call_plus_one", offsetof(Entry, call_plus_one)},
          {"entry_id", offsetof(Entry, id)},            {"entry_offset", offsetof(Entry, offset)},
          {"entry_slot", offsetof(Entry, slot)},        {"entry_bytes_field", offsetof(Entry, bytes)}};
}

}  // namespace commlib
