// Peers' buffers, mapped (issue #38, item 1): users' device buffers registered lazily, as vLLM's
// custom all-reduce and torch's symmetric memory do, so a one-sided kernel reads and writes the
// peers' buffers of a call in place. Device-interface only (device/device.h); one per engine.
//
// What a rank does for a buffer of a call (lookup):
//  1. Its own side: the allocation the pointer lies in (Device::memory_range: base, size, CUDA's
//     buffer id, shareable), registered once per allocation: its IPC handle (of the base) written
//     into a slot of this rank's *segment table*, host memory the peers on this host map. The
//     registration is keyed by the buffer id, never by the address: memory freed and allocated
//     again at the same address has another id, so the old slot is retired (the peers close their
//     mapping of it) and the new allocation registered afresh.
//  2. Every rank writes (buffer id, slot, offset, bytes) of the call's buffer into its *call ring*
//     (host memory the peers map, one entry per (call number, buffer of the call)), a store into
//     memory: no round trip. (lookup's ring, keyed by its caller's numbers; agree's calls, the
//     engine's, have a ring of their own beside it, so the two numberings never meet.)
//  3. The peers' side: peer p's (buffer id, slot, offset) for this call is read from p's ring when
//     p has reached the call; otherwise it is *predicted*: the one p used the last time this rank
//     called with the same (buffer id, offset, bytes), learnt from p's ring. Only a rank with no
//     prediction (its first call with this buffer) waits, on the host, for p's ring entry (a miss:
//     bounded by the timeout; deadlock-free when every rank makes its calls in the same order,
//     since p's host reaches the call without waiting for this rank's later calls). A hit waits
//     for nobody. p's slot is imported once (Device::import_memory) and kept while p's table
//     still holds that buffer id in the slot.
//  4. A prediction can be wrong (p changed its buffer while this rank kept its own): so the answer
//     carries, for every peer, the (buffer id, offset) its address assumes, and the kernel uses a
//     peer's address only where that peer's call descriptor carries the same (its own `id` and
//     `offset`): elsewhere it takes the staged path for the pair. A wrong prediction is corrected
//     from the ring by the next lookup of the same buffer.
//  Not mapped (null): memory without a shareable handle (VMM without one, a cudaMallocAsync or
//  CuPy-style pool), memory of another device, a full segment table, a peer not on this host, a
//  lookup while the stream captures (no IPC call is allowed then) that would need an import.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <string>
#include <utility>
#include <unordered_map>
#include <vector>

#include "device/device.h"

namespace commlib {

// What agree and agree_arena throw when the peer whose entry they wait for is closing (its table
// marked by mark_closing): that entry never comes. `peer`: the rank.
struct PeerClosing : std::runtime_error {
  PeerClosing(int peer, const std::string& what) : std::runtime_error(what), peer(peer) {}
  int peer;
};

// A buffer of a call as one rank registered it: id 0 = not registered (that rank's buffer is
// staged, and nobody maps it).
struct PeerBufferTag {
  uint64_t id = 0;      // the allocation's buffer id (process-unique; compared per peer)
  uint64_t offset = 0;  // of the call's pointer in the allocation
  bool operator==(const PeerBufferTag& o) const { return id == o.id && offset == o.offset; }
};

// The answer for one buffer of one call.
struct PeerBufferView {
  PeerBufferTag own;             // what this rank's call descriptor carries for the buffer
  std::vector<char*> peer;       // peer[p]: p's buffer mapped here (its pointer), null: not mapped
  std::vector<PeerBufferTag> expect;  // the tag peer[p] assumes: use peer[p] only if p's own == it
  bool all_mapped() const;       // every peer's address known (this rank's own entry excluded)
};

class PeerBuffers {
 public:
  static constexpr uint32_t kSegments = 1024;  // registered allocations per rank at once
  static constexpr uint32_t kRing = 256;       // calls kept in a rank's call ring
  static constexpr uint32_t kBuffersPerCall = 4;

  PeerBuffers(std::shared_ptr<Device> device, int rank, int size, double timeout_s);
  ~PeerBuffers();

  // "<pid>.<fd>" of this rank's table (segments + call ring), for the peers on this host.
  std::string local_handle() const;
  // Maps every peer's table; `same_host[p]` false: p's buffers are never mapped here.
  void connect(const std::vector<std::string>& handles, const std::vector<bool>& same_host);

  // Buffer `which` (< kBuffersPerCall) of call number `call` (the communicator's, the same on
  // every rank; calls in increasing order) at `ptr`, `bytes` long. `captured`: the stream
  // captures (no export, import or wait: what would need one is not mapped). `stop`: polled while
  // a miss waits (the engine failed); a peer not reaching the call within the timeout throws
  // std::runtime_error naming it.
  PeerBufferView lookup(uint64_t call, unsigned which, const void* ptr, size_t bytes, bool captured = false,
                        const std::function<bool()>& stop = nullptr);

  // The exact, agreed form of lookup (peer_buffers_agree.cc), for a call whose route every rank
  // must choose alike (the kernel path's one-sided calls): this rank's tags of the call's input and
  // output (buffers 0 and 1; a null `in`: none, so every rank stages) go into its ring as lookup's
  // does, both before it reads any peer's, then it waits for every peer's two entries of the call
  // (no prediction; bounded by the timeout, `stop` polled): one wait for the slowest peer per call.
  // A peer whose entry is missing while its table says it is closing (mark_closing: it makes no
  // call any more) never writes it: PeerClosing naming it, at once, not the timeout.
  // True when every rank registered both buffers: every rank then reads the same ring entries and
  // answers true, and in_view/out_view->peer hold every peer's buffers mapped here (a peer's
  // segment that cannot be mapped although registered throws std::runtime_error naming the rank:
  // this rank alone would stage). False: the views' peer all null, on every rank. What it asks the
  // driver: nothing for a symmetric pool's block (its arena is mapped here already), else one
  // pointer query per allocation (the output in the input's allocation: none more), which tells a
  // freed-and-reallocated buffer at the same address from the one registered (its buffer id).
  // The call numbers of agree (and agree_arena) are the engine's own, written into a ring of their
  // own: lookup's numbers (its caller's) never meet them, so both may be used on one registry.
  bool agree(uint64_t call, const void* in, size_t in_bytes, const void* out, size_t out_bytes,
             const std::function<bool()>& stop, PeerBufferView* in_view, PeerBufferView* out_view);

  // Marks this rank's table closing: it makes no one-sided call any more (StreamEngine::close, first
  // thing), so peers waiting in agree or agree_arena for its entry of a later call stop at once.
  void mark_closing();

  // The kernel path's staging arena (stream/kernel_path_arena.cc): `base` (the start of an
  // allocation, `bytes` long; null: this rank has none) registered as share_arena does, its share
  // exchanged through the call ring as buffer `which` of call number `call` (agree's wait: every
  // rank calls it for the same call) rather than through the communicator, every peer's imported
  // once. True when every rank shared one: peers[q] is rank q's arena as this process maps it
  // (peers[rank] = base); false on every rank otherwise.
  bool agree_arena(uint64_t call, unsigned which, const void* base, size_t bytes, const std::function<bool()>& stop,
                   std::vector<char*>* peers);
  // The staging arenas' retirement (kernel_path_arena.cc): publish_arenas_done sets bits of this
  // rank's word in its table (bit g: this rank reads no rank's arena of generation g any more and
  // closed its imports of them), arenas_done(p) reads rank p's (p = this rank: its own);
  // close_arena_imports closes this rank's imports of the peers' arena mapped at peers[p]
  // (agree_arena's answer; this rank's own entry skipped); retire_arena retires this rank's
  // registration of its arena at `base` (before it is freed).
  void publish_arenas_done(uint64_t bits);
  uint64_t arenas_done(int p) const;
  void close_arena_imports(const std::vector<char*>& peers);
  void retire_arena(const void* base);

  // Symmetric arenas (commlib/device/symmetric.py; peer_buffers_symmetric.cc): the pool's memory,
  // registered and mapped when the pool allocates it, not at a call. Every rank calls, in the same
  // order: share_arena (this rank's arena registered: its handle in the segment table; id 0: not
  // shareable, nothing mapped), an exchange of the shares through the communicator (the pool's),
  // then map_arena (every peer's arena imported once; a peer's share that cannot be mapped throws
  // naming the rank). A lookup of a buffer inside a mapped arena then answers at once for every peer
  // (the peer's arena at the same offset: the pool's blocks are at the same offsets everywhere), a
  // hit that waits for nobody, carrying the tags it assumes as a prediction does. unmap_arena (the
  // pool releases the arena, on every rank, before any rank frees it) closes this rank's imports of
  // the peers' arenas and retires its registration.
  struct ArenaShare {
    uint64_t id = 0;    // the arena's buffer id (0: not registered)
    uint32_t slot = 0;  // its slot in the owner's segment table
  };
  ArenaShare share_arena(const void* base, size_t bytes);
  void map_arena(const void* base, size_t bytes, const std::vector<ArenaShare>& every);
  void unmap_arena(const void* base);
  size_t arenas() const;  // arenas mapped now

  // Closes every import and forgets every registration (the communicator closes). Idempotent.
  void close();

  struct Stats {
    uint64_t registered = 0, retired = 0, imported = 0, closed = 0, hits = 0, misses = 0, waits = 0,
             mispredicted = 0, unshareable = 0, arena_hits = 0,  // arena_hits: of hits, inside a symmetric arena
             agree_sleeps = 0;  // sleeps of agree's and lookup's waits (a peer later than the spins and yields)
  };
  Stats stats() const;
  // This rank's live registrations and the peers' slots it maps now.
  size_t registrations() const;
  size_t imports() const;
  // The table's layout as byte offsets and sizes (peer_buffers_table.h), for the tests that forge a
  // peer's entries through /proc: they read it here rather than keep a copy that could drift.
  static std::vector<std::pair<std::string, size_t>> table_layout();

 private:
  struct Shared;  // the table's layout (peer_buffers.cc)
  struct Own {
    uint32_t slot;
    uint64_t id;
    size_t bytes;
  };
  struct Import {
    uint64_t id = 0;
    char* base = nullptr;
    uint64_t bytes = 0;  // the allocation's bytes: its segment's word, at most what the driver mapped
    // Whether [offset, offset + n) lies in the allocation (a peer's entry is checked before use).
    bool holds(uint64_t offset, uint64_t n) const { return offset <= bytes && n <= bytes - offset; }
  };
  struct RingTag {
    PeerBufferTag tag;
    uint32_t slot = 0;
    uint64_t call = 0;
    uint64_t bytes = 0;  // the bytes of the buffer from tag.offset on the call uses (its owner's word)
  };
  enum class Ring { Lookup, Agreed };  // which of a rank's two call rings (see agree)
  struct Arena {  // a symmetric arena, mapped (share_arena, map_arena)
    const char* base;
    size_t bytes;
    ArenaShare own;
    std::vector<ArenaShare> every;  // [rank]
  };
  struct Pending {  // a prediction, to be checked against the peers' rings
    uint64_t call;
    unsigned which;
    std::string key;
    uint64_t unresolved;  // peers (bit p % 64) whose ring entry for the call is not read yet
  };
  // How lookup and agree open a call (mu_ held): `which` checked, the closed check, the peers'
  // retired imports closed (not while capturing: no driver call may run then), `v` sized for every rank.
  void open_call(unsigned which, bool captured, PeerBufferView& v);
  // `known`: the range of ptr's allocation, already asked (no second query).
  PeerBufferTag register_own(const void* ptr, size_t bytes, bool captured, uint32_t* slot,
                             const Device::MemoryRange* known = nullptr);
  // agree's tag of one buffer (mu_ held): a symmetric arena's without a driver call, else
  // register_own's, querying the range unless *range (the other buffer's) holds it; updates *range.
  PeerBufferTag agreed_tag(const void* ptr, size_t bytes, uint32_t* slot, Device::MemoryRange* range);
  void retire(char* base);
  void write_ring(uint64_t call, unsigned which, const PeerBufferTag& tag, uint32_t slot, Ring ring, uint64_t bytes);
  int read_ring(int p, uint64_t call, unsigned which, RingTag* out, Ring ring) const;
  char* mapped(int p, const RingTag& t, bool captured);
  // A peer's entry trusted no further than it can be checked (agree, agree_arena): mapped(p, t),
  // and the entry's extent (tag.offset + bytes) inside the allocation its segment registered; an
  // entry that is not (a count or offset out of range: a peer's fault, never used) or cannot be
  // mapped throws std::runtime_error naming rank p, call `call` and `what`.
  char* checked_mapping(int p, const RingTag& t, uint64_t call, const char* what);
  void close_retired(int p);
  // agree's wait (mu_ held): every peer's ring entries of (call, first + w) for w < n into
  // tags[w][p], bounded by the timeout, `stop` polled; spins kAgreeSpins times, then yields up to
  // kAgreeYields, then sleeps 20 us a time (stats_.agree_sleeps).
  void wait_entries(uint64_t call, unsigned first, unsigned n, const std::function<bool()>& stop,
                    std::vector<RingTag>* tags);
  static constexpr unsigned kAgreeSpins = 64, kAgreeYields = 4096;
  // One turn of agree's and lookup's waits for a peer: spins kAgreeSpins times, then yields up to
  // kAgreeYields, then sleeps 20 us a time (stats_.agree_sleeps).
  void back_off(unsigned spin);
  void learn(const std::string& key, int p, const RingTag& t);
  void check_predictions();
  // lookup's answer for a buffer inside a mapped arena (mu_ held); false: in none.
  bool arena_view(uint64_t call, unsigned which, const void* ptr, size_t bytes, bool captured, PeerBufferView& v);

  std::shared_ptr<Device> device_;
  const int rank_, size_;
  const double timeout_s_;
  int fd_ = -1;
  Shared* mine_ = nullptr;
  std::vector<Shared*> peers_;
  std::vector<uint64_t> retired_seen_;
  mutable std::mutex mu_;
  std::unordered_map<char*, Own> own_;  // by allocation base
  std::vector<uint32_t> free_slots_;
  std::vector<std::vector<Import>> imports_;  // [peer][slot]
  // What each peer used the last time this rank used (id, offset, bytes, which): [key][peer].
  std::unordered_map<std::string, std::vector<RingTag>> predicted_;
  std::vector<Pending> pending_;
  std::vector<Arena> arenas_;
  std::vector<RingTag> agree_tags_[2];  // agree's peers' entries (input, output), kept: no allocation per call
  Stats stats_;
};

}  // namespace commlib
