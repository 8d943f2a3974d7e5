// The kernel path of the stream engine (issue #25): a collective on device buffers runs as ONE
// kernel launch that interprets this rank's device plan (kernels/device_plan.h, lowered from the
// same schedule the copy path runs, cached per call shape), moving chunks through peers' kernel
// regions (IPC-mapped device memory) and synchronising only with flags in device memory
// (kernels/plan_kernel.cuh). The copy path (copy-engine copies ordered by stream memory
// operations, stream_engine.h) stays for large messages: COMMLIB_DEVICE_PATH=auto|kernel|copy.
//
// The engine owns one KernelPath (null with COMMLIB_DEVICE_PATH=copy): its region's handle travels
// with the engine's handle, connect() maps the peers' regions, enqueue() launches. The engine's
// watchdog judges kernel calls like any other (peers dead or failed, descriptor mismatches, the
// timeout, with the kernel's progress words as progress) and, when the engine fails, abort() sets
// the abort word every wait loop of the kernel polls, so no launch spins past the verdict.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include "common/types.h"
#include "device/device.h"
#include "device/peer_buffers.h"
#include "kernels/device_plan.h"
#include "plan/call.h"
#include "policy/device_auto.h"
#include "schedule/ir.h"
#include "stream/device_path.h"
#include "stream/kernel_occupancy.h"
#include "stream/staged_peers.h"
#include "transport/transport.h"  // CallDesc

namespace commlib {

// DevicePath, the crossover and the size rule are device auto's, decided in policy/device_auto.h.
DevicePath device_path_from_env();
const char* device_path_name(DevicePath p);
// Every rank's kernel handle ("<mode>:..."): std::invalid_argument naming COMMLIB_DEVICE_PATH when
// a rank uses another mode than `mine` (the ranks must choose the same path for every call).
void check_device_paths(const std::vector<std::string>& kernel_handles, DevicePath mine, int rank);
// COMMLIB_DEVICE_LL_BYTES for slots of `slot_bytes` (at most a slot; std::invalid_argument naming
// it unless a multiple of 64 up to 65536).
uint32_t device_ll_bytes_from_env(uint64_t slot_bytes);
// The largest split threshold (KernelPath::split_bytes_: chunks of at least half a slot, at most
// this, are split over the whole message grid). A split chunk costs every block of the grid a wait
// on its flag and a system-scope arrival, each rank's blocks in lockstep: the H200 run of session 31
// (4 ranks, one GPU, MPS) measured ~40-60 us per split chunk (direct 412 us at 64 KiB against 74 at
// 16 KiB; ring 683 at 256 KiB against 66 at 64 KiB; two_shot 552 against 88), about what one
// block streams 1 MiB in (~20 GB/s per block): below it a chunk is faster on its own block.
// (64 KiB before: docs/gpu.md "Device auto by the cost model".)
constexpr uint64_t kSplitMaxBytes = uint64_t{1} << 20;
// COMMLIB_DEVICE_TRACE (0 or 1): whether kernel-path launches stamp their steps (kernel_path_trace.cc).
bool device_trace_from_env();

// The kernel path caches its plans by call shape, the plan cache's ScheduleKey (plan/call.h) with
// the RESOLVED algorithm in `algo` (never 0 = auto), so a new tuning table that makes auto choose
// differently never finds a stale plan.

// The host page's words (host memory mapped for the device): word 0 the abort word, word 1 the
// number of the last eager launch completed, word 2 of the last replayed (captured) launch
// completed, word 3 of the last one started, words 8.. the blocks' progress words, words 64.. the
// call check's mismatch record (plan_call_check.cuh). The kernel only writes the page (and polls
// the abort word while it waits): what it reads back, the blocks' chunk counts, is device memory.
namespace kernel_page {
constexpr size_t kDoneWord = 1;
constexpr size_t kReplaysDoneWord = 2;
constexpr size_t kReplaysStartedWord = 3;
constexpr size_t kProgressWord = 8;
constexpr size_t kMismatchWord = 64;
}  // namespace kernel_page

class KernelPath final : public DevicePathRunner {
 public:
  // Allocates this rank's kernel region (flags zeroed) and its host page (abort word, progress).
  // `timeout_s`: how long a peer-buffer registration waits for a peer (device/peer_buffers.h).
  KernelPath(std::shared_ptr<Device> device, int rank, int size, uint32_t nslots, uint64_t slot_bytes, DevicePath mode,
             double timeout_s = 300.0);
  ~KernelPath() override;

  // "<mode>,<LL bytes>,<auto's crossover>,<block bytes>,<staging>,<peer buffers' table>,<residency>:<region handle>", the part
  // of the engine's handle the peers need (the last two: kernel_path_setup.cc).
  std::string local_handle() const;
  // Every rank's local_handle(); `one_host`: every rank is on this rank's host (otherwise the
  // kernel path stays off: it needs every peer's memory). std::invalid_argument when a rank uses
  // another COMMLIB_DEVICE_PATH or COMMLIB_DEVICE_LL_BYTES.
  void connect(const std::vector<std::string>& handles, bool one_host);

  // Connected, every rank on this host, the device has kernels: whether device auto
  // (policy/device_auto.h) may send a call here at all (the same answer on every rank).
  bool usable() const { return usable_; }
  // auto's crossover for this engine's world size, read once when it is created (device_auto.h).
  uint64_t kernel_max_bytes() const { return kernel_max_bytes_; }
  uint32_t ll_bytes() const { return ll_bytes_; }           // COMMLIB_DEVICE_LL_BYTES as this path runs it
  uint64_t block_bytes() const { return block_bytes_; }     // COMMLIB_DEVICE_BLOCK_BYTES
  // Enqueues the call's kernel on `stream` (DevicePathRunner): the plan's schedule lowered once per
  // call shape, the descriptor checked against the peers' inside the kernel before the first step
  // (plan_call_check.cuh). What the watchdog watches of a launch: Launched::done (host address)
  // reaches its target when the launch completes.
  Launched enqueue(const PathCall& call, DeviceStream& stream) override;
  // The same with the call's shape `key` (plan/call.h, the RESOLVED algorithm) and its parts.
  // `captured`: `stream` is capturing (the engine's capture mode): the plan must exist already
  // (has_plan), is pinned for the life of the graph (Device::retain_in_capture: never evicted
  // while a graph holds it), and the launch is left to the graph's replays (no watchdog wait).
  // `mapped`: a one-sided call's agreed route (device_path.h; null or not mapped: staged). `slot`: a
  // prepared call's (device_path.h): its plan is taken from there once found, not looked up.
  Launched launch(const ScheduleKey& key, const Schedule& sched, const CallDesc& desc, char* const bases[3],
                  DType dtype, RedOp op, DeviceStream& stream, bool captured = false,
                  const MappedPeers* mapped = nullptr, KernelPlanSlot* slot = nullptr);
  // A call of one-sided shape `key` can run staged through the slots (its staged buffers fit the
  // slots area: std::invalid_argument naming the settings otherwise), before anything is enqueued
  // or numbered. A mapped call (every rank's buffers in place) needs no slots and is not asked, nor
  // an eager call the staging arena holds (pool_holds).
  void check_one_sided(const ScheduleKey& key) const;
  // The bytes a staged one-sided call may use (the slots area): the one bound of both the fit
  // (stage_layout) and the peers' mapped staging (StagedPeerBuffers, connect); device auto's too.
  size_t staging_capacity() const;
  // The staging arena (COMMLIB_DEVICE_STAGING=pool, kernel_path_arena.cc): this rank's symmetric
  // block that an eager staged one-sided call copies its buffers into and its peers read in place,
  // registered and mapped as the symmetric pool's arenas are (device/peer_buffers.h), so it needs
  // neither the slots nor their closing handshake. The bytes a staged call of shape `key` needs
  // (0: nothing staged), whether the arena holds that many now, and its growth: every rank at the
  // same call (the shapes are symmetric and the sizes a function of the calls, so every rank grows
  // alike), exchanged through the registry's ring as call number `call` (a host wait for every
  // peer); false when some rank could not make or share one (pool staging then stays off, on every
  // rank: its slots path runs). `stop` as PeerBuffers::agree's.
  uint64_t staging_need(const ScheduleKey& key) const;
  bool pool_holds(uint64_t need) const { return pool_staging_ && arena_.base && need && arena_.bytes >= need; }
  bool pool_staging() const { return pool_staging_; }
  bool grow_arena(uint64_t need, uint64_t call, const std::function<bool()>& stop);
  uint64_t arena_bytes() const { return arena_.bytes; }
  // Whether a captured call of shape `key` (its plan uploaded: has_plan) stages in the arena: the
  // arena holds it and the peers' table of this arena for its shape was uploaded by an eager call
  // of the shape since the arena last grew (a capture may not upload). The same on every rank (the
  // arena grows alike, and every rank makes the same eager calls); otherwise the capture stages
  // through the slots (check_one_sided) or is refused by name.
  bool arena_captures(const ScheduleKey& key) const;
  // The retired arenas (grown out of) that nothing reads any more are freed: this rank's
  // captured graphs that held one are destroyed (their pins dropped) and its eager launches staged
  // in it completed, so it closes its imports of the peers' arenas of that generation and says so
  // in its table (PeerBuffers::publish_arenas_done); an arena every rank is done with is freed,
  // stream-ordered on `stream`. Run at every eager call of the engine (a driver call may run there;
  // never in a capture), collectives and point-to-point alike, before a call's route agreement and
  // again after it (a host wait for every peer: what each published before agreeing is freed then).
  void collect_arenas(DeviceStream& stream);
  struct ArenaCounts {
    uint64_t grown = 0;    // arenas allocated and shared (the current one included)
    uint64_t retired = 0;  // grown out of, not freed yet
    uint64_t pinned = 0;   // of the retired, held by a live captured graph on this rank
    uint64_t freed = 0;    // retired arenas freed before the engine closed
    uint64_t tables = 0;   // peers' tables listed for the current arena (one per staged layout)
    uint64_t held_bytes = 0;  // the bytes of the arenas held: the current one and the retired ones
  };
  ArenaCounts arena_counts() const;
  // Test hook: this rank's next arena allocations fail (as out of memory), so every rank falls
  // back to the slots (grow_arena).
  void fail_arena_allocations(bool on) { fail_arena_allocations_ = on; }
  // Whether the plan of call shape `key` is on the device (an eager call of that shape ran).
  bool has_plan(const ScheduleKey& key) const { return plans_.count(key) != 0; }
  // Plans held by a captured graph (kept however many plans there are, out of the cache once evicted).
  size_t pinned_plans() const {
    size_t n = 0;
    for (const auto& entry : plans_) n += entry.second.pin.use_count() > 1;
    for (const Uploaded& u : held_plans_) n += u.pin.use_count() > 1;
    return n;
  }
  // A launch's check found a peer's descriptor different from its own: the message naming both
  // ranks and both calls (the watchdog fails the engine with MismatchError; the kernel waits for
  // the abort word meanwhile, so the call does not complete before it).
  bool mismatch(std::string* message) const;

  // Sets the abort word: every wait loop of a running or later launch returns.
  void abort();
  // The kernel's progress words summed (the watchdog: a change is progress).
  uint64_t progress() const;
  // Closes the peers' regions this rank imported (the engine's close, before the ranks' barrier).
  void close_imports();
  // Frees this rank's memory, stream-ordered on `stream`, after the engine's calls drained; the
  // exported region only when `free_region` (every peer closed its import and nothing failed:
  // otherwise it is leaked rather than freed under a peer, like the inbox). Idempotent.
  void release(DeviceStream& stream, bool free_region);

  // Peers' buffers, registered lazily (device/peer_buffers.h): what a one-sided plan reads and
  // writes in place; connected with the kernel path (every rank on this host), closed with it.
  PeerBuffers& peer_buffers() { return *peer_buffers_; }
  // The most blocks a launch of this rank uses (kernel_occupancy.h: its share of the device's
  // resident blocks); 0: no limit known.
  unsigned grid_budget() const { return grid_budget_; }
  // The most blocks a one-sided launch uses, the same on every rank (kernel_occupancy.h: a block per
  // SM, within every rank's budget; 1 before connect).
  unsigned one_sided_grid() const { return one_sided_grid_; }

  DevicePath mode() const { return mode_; }
  uint64_t launches() const { return launches_; }  // eager launches enqueued
  // Lookups of a device plan by call shape so far (a prepared call's repeated launches make none:
  // tests pin that, issue #37).
  uint64_t plan_lookups() const { return plan_lookups_; }
  bool captured_any() const { return captured_any_.load(std::memory_order_relaxed); }  // some launch was captured
  // The watchdog thread's view of replays (StreamEngine::watch_replays): when one last progressed,
  // when peers were last checked, the progress words' sum then.
  struct ReplayWatch {
    std::chrono::steady_clock::time_point progress, slow;
    uint64_t seen = 0;
  };
  ReplayWatch replay_watch;
  // Launches of captured graphs' kernels run so far (all graphs of this path), as the kernel counts.
  uint64_t replays_done() const;
  // A replayed launch started and has not completed (the watchdog watches it: stream_capture.cc).
  bool replay_running() const;
  // Message chunks (sent and received) the launches so far moved by the LL protocol and through
  // slots (the kernel's own record, read once its launches completed: what tests check the
  // protocol choice with).
  struct ChunksMoved {
    uint64_t ll = 0, slots = 0;
  };
  ChunksMoved chunks_moved() const;
  // Test hook: every pair's chunk numbers continue from `n` (every rank sets the same, between
  // drained calls), so a test crosses the LL flags' epoch (2^32 - 1 chunks, plan_ll.cuh) in a few
  // calls.
  void start_chunk_numbers_at(uint64_t n);
  // COMMLIB_DEVICE_TRACE=1 (kernel_path_trace.cc, kernels/plan_trace.cuh): the latest launch's
  // per-block, per-step stamps, one record per (block, step) in block then step order; empty when
  // the setting is off or nothing ran. Read once the launch completed (the caller synchronised).
  struct TraceRecord {
    uint32_t block = 0, step = 0;
    uint64_t start_ns = 0, end_ns = 0;  // the device's clock (%globaltimer)
  };
  std::vector<TraceRecord> trace() const;
  bool tracing() const { return tracing_; }

 private:
  struct Uploaded {
    DevicePlan plan;
    void* dev = nullptr;  // items | steps | sends_to | recvs_from | arrivals (a word per item)
    int first_peer = -1;  // the plan's first message (the watchdog's view of a launch)
    bool has_peers = false;  // some message: the launch checks the call's descriptor
    bool first_is_send = false;
    bool has_split = false;  // some item of at least split_bytes_: the launch takes every block
    bool small = false;  // every item at most ll_bytes_: the launch takes one block
    bool every_peer = false;  // every other rank has a message in the plan (a small call may fold its check)
    // One-sided plans (kernel_path_one_sided.cc): the buffers some rank's plan addresses at a
    // peer (any rank's: BufferId bits), staged through the slots area (in place for an all_reduce
    // whose input and output both are), the staged bytes, the grid, and the peers' table
    // ([size][3] addresses, in `dev` at `table_at`).
    uint8_t peer_bufs = 0;
    bool stage_in_place = false;
    uint64_t stage_bytes[2] = {0, 0};
    uint64_t stage_out_at = 0;  // the staged output's offset in the slots area (0 in place)
    uint64_t stage_need = 0;  // bytes of slots the staged path needs; fits: within staging_capacity()
    bool stage_fits = true;
    unsigned os_grid = 1;
    size_t table_at = 0;
    // Held by every graph that captured a launch of the plan (a CUDA user object): the plan is
    // not evicted while a copy is alive.
    std::shared_ptr<char> pin = std::make_shared<char>(0);
  };
  const Uploaded& upload(const ScheduleKey& key, const Schedule& sched, DeviceStream& stream);
  // Copies `bytes` to device memory `dev` in `stream`'s order, out of pinned host memory.
  void stage(const std::vector<char>& bytes, void* dev, DeviceStream& stream);
  size_t flag_bytes() const;
  size_t slots_bytes() const;
  size_t region_bytes() const;
  size_t descs_offset() const;  // of the descriptor ring in the region
  uint32_t desc_ring_len() const;
  size_t barrier_offset() const;  // of the barrier's line in local_ (after sent | received | checked)
  size_t chunk_counts_offset() const;  // of the blocks' chunk counts in local_ (after the barrier)
  size_t views_offset() const;  // of the peer views in local_ (after the chunk counts)
  // One-sided plans (kernel_path_one_sided.cc).
  size_t os_flags_offset() const;  // of the one-sided flags in the region (after the descriptor ring)
  size_t os_flag_words() const;    // per rank: [size][kSignalTags + 1][kMaxGrid]
  size_t os_local_offset() const;  // of the signalled | consumed counts in local_ (after the LL stages)
  size_t local_bytes() const;
  // The one-sided parts of an upload (peer_bufs over every rank's schedule, staging, grid, table),
  // appended to `host` (the plan's upload image); std::invalid_argument when the call cannot run.
  void plan_one_sided(const ScheduleKey& key, Uploaded& u, std::vector<char>& host) const;
  // The staging of a one-sided call shape (Uploaded's peer_bufs, stage_in_place, stage_bytes).
  void stage_layout(const ScheduleKey& key, Uploaded& u) const;
  void fill_one_sided(kexec::PlanLaunch& a, const Uploaded& u, char* const bases[3], const MappedPeers* mapped,
                      bool captured, DeviceStream& stream);
  // A staged launch through the staging arena (kernel_path_arena.cc): the caller's buffers copied
  // into this rank's arena, the peers' table of their arenas, no closing handshake.
  // `captured`: the arena is retained in the capture (its pin) and the table must exist already.
  void fill_arena_staged(kexec::PlanLaunch& a, const Uploaded& u, char* const bases[3], DeviceStream& stream,
                         bool captured);
  // The peers' table words of a staged launch of `u` in the current arena.
  std::vector<uint64_t> arena_words(const Uploaded& u) const;
  // Whether a launch of `u` stages in the arena (eager: the arena holds it; captured: arena_captures).
  bool stages_in_arena(const Uploaded& u, bool captured) const;
  // The staging arena: this rank's (base, bytes), every peer's base as this process maps it, its
  // generation (growths so far: the same on every rank), its peers' tables by shape (uploaded at
  // eager calls, freed with the arena), and its pin: held by every graph that captured a launch
  // staged in it (a CUDA user object), so a retired arena is freed only once no graph holds it.
  struct Arena {
    char* base = nullptr;
    uint64_t bytes = 0;
    std::vector<char*> peers;
    uint32_t generation = 0;
    std::map<std::vector<uint64_t>, void*> tables;
    std::shared_ptr<char> pin = std::make_shared<char>(0);
    uint64_t last_launch = 0;     // retired: the eager launches enqueued by then (the done word's)
    bool imports_closed = false;  // retired: this rank is done with it (publish_arenas_done)
  };
  Arena arena_;
  std::vector<Arena> retired_arenas_;
  std::vector<char*> unshared_arenas_;  // allocated by a growth some rank failed: freed at release
  uint32_t arena_generations_ = 0;
  uint64_t arenas_freed_ = 0;
  bool fail_arena_allocations_ = false;
  void free_arena_tables(Arena& a, DeviceStream& stream);
  bool pool_staging_ = true;  // COMMLIB_DEVICE_STAGING=pool, and no rank failed to share an arena
  // The peers' table [size][3] of a mapped call on the device: uploaded once per set of addresses
  // (a loop over the same buffers uploads nothing), freed stream-ordered at release or when more
  // than kMappedTables sets were seen (every launch using one is ordered before the free).
  const uint64_t* mapped_table(const std::vector<uint64_t>& words, DeviceStream& stream);
  void release_mapped_tables(DeviceStream& stream);
  static constexpr size_t kMappedTables = 256;
  std::map<std::vector<uint64_t>, void*> mapped_tables_;
  // A mapped call's table, the key looked up in mapped_tables_: kept across calls and refilled in
  // place (a vector per call was a heap allocation per steady mapped call, issue #37 item 1).
  std::vector<uint64_t> mapped_words_;

  // kernel_path_setup.cc: the handle's fields of the peer buffers and the residency, their
  // connection (the grid's budget, std::invalid_argument when COMMLIB_DEVICE_PATH=kernel cannot
  // fit), the blocks of a launch and the launch itself (through the device's LaunchChain).
  std::string setup_fields() const;
  void connect_setup(const std::vector<std::string>& peer_tables, const std::vector<std::string>& residencies,
                     bool one_host);
  unsigned launch_blocks(unsigned wanted) const;
  void launch_in_chain(const kexec::PlanLaunch& a, unsigned blocks, DType dtype, RedOp op, bool reduces,
                       DeviceStream& stream, bool captured);

  std::shared_ptr<Device> device_;
  const int rank_, size_;
  std::shared_ptr<PeerBuffers> peer_buffers_;
  unsigned grid_budget_ = 0;
  unsigned one_sided_grid_ = 1;
  const uint64_t claim_nonce_ = random_claim_key();  // rank 0's names the communicator's grid claims
  GridClaims claims_;           // released at release() (close) or with the path
  std::shared_ptr<LaunchChain> chain_;  // joined while set
  std::shared_ptr<DeviceEvent> chain_event_;
  const uint32_t nslots_;
  const uint64_t slot_bytes_;
  const DevicePath mode_;
  const uint32_t ll_bytes_;  // COMMLIB_DEVICE_LL_BYTES, at most a slot
  const uint64_t kernel_max_bytes_;  // auto's crossover (device_path_tuning.h)
  // Chunks of at least this many bytes run on every block of the grid (plan_kernel.cuh, split
  // items): half a slot, at most kSplitMaxBytes, always above ll_bytes_.
  const uint32_t split_bytes_;
  // One-sided plans: at least this many bytes per block per handshake (COMMLIB_DEVICE_BLOCK_BYTES).
  const uint64_t block_bytes_;
  std::unique_ptr<StagedPeerBuffers> staged_peers_;  // the slots areas, once connected
  bool usable_ = false;  // connected, every rank on this host, the device has a kernel path
  char* region_ = nullptr;         // exported: ready | freed | slots | LL slots
  void* local_ = nullptr;          // this rank only: sent | received | barrier | peer views | LL stages
  std::vector<char*> imported_;    // peers' regions
  char* host_page_ = nullptr;      // abort word, progress words
  uint64_t* host_page_dev_ = nullptr;
  std::atomic<bool> captured_any_{false};
  uint64_t launches_ = 0;          // eager launches enqueued (the kernel counts them too: the done word)
  std::unordered_map<ScheduleKey, Uploaded, ScheduleKeyHash> plans_;  // device memory stream-ordered
  std::vector<Uploaded> held_plans_;  // evicted from plans_ while a graph held them: freed once none does
  // Advanced whenever a plan leaves plans_: a KernelPlanSlot of an older generation is stale (an
  // entry's address is stable otherwise: unordered_map keeps its nodes across rehashes).
  uint64_t plans_generation_ = 1;
  uint64_t plan_lookups_ = 0;
  // Pinned host memory (map_host) the plans are copied from: a copy out of pageable memory may
  // wait for the stream, which may be parked in a wait for a peer. [0, staged_) may still be
  // copied from until `staged_copied_` (recorded after the latest copy) completes; an arena grown
  // out of is kept until release (growth is geometric).
  struct Staging {
    char* host = nullptr;
    size_t bytes = 0;
  };
  Staging staging_;
  size_t staged_ = 0;
  std::vector<Staging> retired_staging_;
  std::shared_ptr<DeviceEvent> staged_copied_;
  std::shared_ptr<DeviceStream> setup_stream_;
  // COMMLIB_DEVICE_TRACE: whether launches stamp, and the device buffer they stamp into (allocated
  // at the first traced launch, zeroed; freed at release).
  const bool tracing_;
  void* trace_ = nullptr;
  uint64_t* trace_buffer();
};

}  // namespace commlib
