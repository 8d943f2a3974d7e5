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
// only); the peers import it once.
//
// Captured calls (stream_capture.cc) stage in the arena as eager ones do, when the arena holds the
// call and an eager call of its shape uploaded the peers' table of this arena (arena_captures: a
// capture may not upload); the captured launch retains the arena's pin in the graph (a CUDA user
// object, Device::retain_in_capture), as it pins its plan. Growth never frees memory a graph
// reads: an arena grown out of is retired, not freed, and collect_arenas (at every eager call of
// the engine, staged or not, so a job that stops staging does not keep them) frees it only once
//  - no live graph of this rank holds its pin (the graphs that captured a launch staged in it were
//    destroyed: their user objects released it), and this rank's eager launches staged in it
//    completed (the done word passed the launches enqueued by the growth), whereupon this rank
//    closes its imports of the peers' arenas of that generation and sets the generation's bit in
//    its table (PeerBuffers::publish_arenas_done), and
//  - every rank set that bit: no rank's graph or launch reads any arena of the generation, and no
//    rank maps it any more.
// Then the owner retires its registration and frees it, stream-ordered. A graph still alive when
// the engine closes is the caller's error (it may not be replayed after close): the engine frees
// its arenas then as before, once every peer closed its imports.
// If some rank cannot allocate or share an arena, every rank reads the same empty share and turns
// pool staging off: the slots path runs from then on, refused by name where it does not fit, and
// the arena it had is retired, as by a growth (every rank alike), and freed as they are.
#include <algorithm>
#include <cstring>
#include <optional>
#include <stdexcept>

#include "device/host_flags.h"
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
    if (fail_arena_allocations_) throw std::runtime_error("out of memory (the test hook)");
    base = static_cast<char*>(device_->allocate(bytes));
  } catch (const std::exception&) {  // out of memory here: share nothing, every rank falls back alike
    base = nullptr;
  }
  std::vector<char*> peers;
  bool every = false;
  try {
    every = peer_buffers_->agree_arena(call, kArenaBuffer, base, bytes, stop, &peers);
  } catch (...) {
    if (base) unshared_arenas_.push_back(base);  // a peer may have mapped it meanwhile
    throw;
  }
  if (!every) {
    if (base) unshared_arenas_.push_back(base);
    pool_staging_ = false;  // on every rank: the same entries read
  }
  if (arena_.base) {  // grown out of, or no arena any more (pool staging off): freed by collect_arenas
    arena_.last_launch = launches_;
    retired_arenas_.push_back(std::move(arena_));
    arena_ = Arena{};
  }
  if (!every) return false;
  arena_.base = base;
  arena_.bytes = bytes;
  arena_.peers = std::move(peers);
  arena_.generation = ++arena_generations_;  // alike on every rank: every rank grows at the same calls
  return true;
}

std::vector<uint64_t> KernelPath::arena_words(const Uploaded& u) const {
  // As the slots' staging (fill_one_sided): input at 0, the output after it (at 0 in place), every
  // rank's at the same offsets of its arena.
  const uint8_t in_bit = 1u << static_cast<int>(BufferId::Input), out_bit = 1u << static_cast<int>(BufferId::Output);
  std::vector<uint64_t> words(static_cast<size_t>(size_) * 3, 0);
  for (int q = 0; q < size_; ++q) {
    words[q * 3 + 0] = (u.peer_bufs & in_bit) ? reinterpret_cast<uint64_t>(arena_.peers[q]) : 0;
    words[q * 3 + 1] = (u.peer_bufs & out_bit) ? reinterpret_cast<uint64_t>(arena_.peers[q] + u.stage_out_at) : 0;
  }
  return words;
}

bool KernelPath::stages_in_arena(const Uploaded& u, bool captured) const {
  if (!pool_holds(u.stage_need)) return false;
  return !captured || arena_.tables.count(arena_words(u)) != 0;
}

bool KernelPath::arena_captures(const ScheduleKey& key) const {
  auto it = plans_.find(key);
  return it != plans_.end() && it->second.peer_bufs && stages_in_arena(it->second, true);
}

void KernelPath::fill_arena_staged(kexec::PlanLaunch& a, const Uploaded& u, char* const bases[3],
                                   DeviceStream& stream, bool captured) {
  const std::vector<uint64_t> words = arena_words(u);
  auto it = arena_.tables.find(words);
  if (it == arena_.tables.end()) {  // the first eager launch of this shape in this arena uploads it
    if (captured) throw std::logic_error("kernel path: a captured arena-staged launch without its table");
    // Never evicted (arena_captures must answer alike on every rank, whatever graphs each holds):
    // one table per staged layout, and the one-sided algorithms stage an input, or an input and
    // output in place, so an arena lists a few; freed with it.
    const size_t bytes = words.size() * sizeof(uint64_t);
    void* dev = device_->allocate_ordered(bytes, stream);
    std::vector<char> host(bytes);
    std::memcpy(host.data(), words.data(), bytes);
    stage(host, dev, stream);
    it = arena_.tables.emplace(words, dev).first;
  }
  if (captured) device_->retain_in_capture(stream, arena_.pin);  // the graph holds the arena (and its tables)
  a.peer_bases = static_cast<const uint64_t*>(it->second);
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

void KernelPath::free_arena_tables(Arena& a, DeviceStream& stream) {
  for (auto& [words, dev] : a.tables) device_->free_ordered(dev, stream);
  a.tables.clear();
}

void KernelPath::collect_arenas(DeviceStream& stream) {
  if (retired_arenas_.empty()) return;
  const uint64_t done = load_flag(reinterpret_cast<const uint64_t*>(host_page_) + kernel_page::kDoneWord);
  // Closing imports and freeing memory are calls a capture in CUDA's global mode prohibits (and is
  // invalidated by), made here at any eager call, while this thread (or another) may capture some
  // other stream: in relaxed mode, as the engine's event queries are (taken once, when needed).
  std::optional<CaptureModeScope> relaxed;
  const auto driver_calls = [&] {
    if (!relaxed) relaxed.emplace(*device_, CaptureMode::Relaxed);
  };
  uint64_t newly = 0;
  for (Arena& a : retired_arenas_) {
    if (a.imports_closed || a.generation >= 64 || a.pin.use_count() > 1 || done < a.last_launch) continue;
    driver_calls();
    peer_buffers_->close_arena_imports(a.peers);  // this rank reads no peer's arena of the generation
    a.imports_closed = true;
    newly |= uint64_t{1} << a.generation;
  }
  if (newly) peer_buffers_->publish_arenas_done(newly);
  uint64_t every = ~uint64_t{0};
  for (int q = 0; q < size_; ++q) every &= peer_buffers_->arenas_done(q);
  for (auto it = retired_arenas_.begin(); it != retired_arenas_.end();) {
    if (!it->imports_closed || !(every >> it->generation & 1)) {
      ++it;
      continue;
    }
    driver_calls();
    peer_buffers_->retire_arena(it->base);
    free_arena_tables(*it, stream);
    device_->free_async(it->base, stream);  // after this rank's launches on `stream`; the others completed
    ++arenas_freed_;
    it = retired_arenas_.erase(it);
  }
}

KernelPath::ArenaCounts KernelPath::arena_counts() const {
  ArenaCounts c;
  c.grown = arena_generations_;
  c.retired = retired_arenas_.size();
  for (const Arena& a : retired_arenas_) c.pinned += a.pin.use_count() > 1;
  c.freed = arenas_freed_;
  c.tables = arena_.tables.size();
  c.held_bytes = arena_.bytes;
  for (const Arena& a : retired_arenas_) c.held_bytes += a.bytes;
  return c;
}

}  // namespace commlib
