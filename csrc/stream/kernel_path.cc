// The kernel path (see kernel_path.h): the kernel region and its handles, the plan cache (plans
// uploaded to device memory once per call shape) and the launch.
#include "stream/kernel_path.h"

#include <sys/mman.h>

#include <algorithm>
#include <cstring>
#include <stdexcept>

#include "common/params.h"
#include "device/host_flags.h"
#include "kernels/plan_kernel.cuh"
#include "plan/describe.h"

namespace commlib {

using kexec::PeerView;
using kexec::PlanLaunch;

namespace {

constexpr size_t kLine = 64;
constexpr size_t kPageBytes = 4096;
using namespace kernel_page;  // the host page's words (kernel_path.h)
static_assert(kProgressWord + kexec::kMaxBlocks <= kMismatchWord &&
                  (kMismatchWord + kexec::kMismatchWords) * 8 <= kPageBytes,
              "the host page's words");
static_assert(sizeof(CallDesc) == 3 * sizeof(uint64_t), "the kernel compares a CallDesc as three words");
constexpr size_t kMaxPlans = 256;
constexpr size_t kMinStaging = 64 * 1024;

size_t round_up(size_t n, size_t to) { return (n + to - 1) / to * to; }

}  // namespace

size_t KernelPath::flag_bytes() const { return round_up(static_cast<size_t>(size_) * nslots_ * 8, kLine); }
size_t KernelPath::slots_bytes() const { return static_cast<size_t>(size_) * nslots_ * slot_bytes_; }
// ready | freed | slots | LL slots (two bytes of lines per byte of data) | descriptor ring
size_t KernelPath::descs_offset() const {
  return 2 * flag_bytes() + slots_bytes() + static_cast<size_t>(size_) * nslots_ * 2 * ll_bytes_;
}
uint32_t KernelPath::desc_ring_len() const { return nslots_ + 2; }  // why: plan_call_check.cuh
size_t KernelPath::region_bytes() const { return os_flags_offset() + os_flag_words() * 8; }
// sent | received | checked (size words each), then the line of the per-call counters (the grid
// barrier's arrivals and generation, the launch numbers: kexec::kCounter*), then the blocks' chunk
// counts ([kMaxBlocks][2]: device memory, so that a launch's end reads nothing from the host)
size_t KernelPath::barrier_offset() const { return round_up(3 * size_ * 8, kLine); }
size_t KernelPath::chunk_counts_offset() const { return barrier_offset() + kLine; }
size_t KernelPath::views_offset() const { return chunk_counts_offset() + round_up(2 * kexec::kMaxBlocks * 8, kLine); }

KernelPath::KernelPath(std::shared_ptr<Device> device, int rank, int size, uint32_t nslots, uint64_t slot_bytes,
                       DevicePath mode, double timeout_s)
    : device_(std::move(device)), rank_(rank), size_(size),
      peer_buffers_(std::make_shared<PeerBuffers>(device_, rank, size, timeout_s)), nslots_(nslots),
      slot_bytes_(slot_bytes), mode_(mode),
      ll_bytes_(device_ll_bytes_from_env(slot_bytes)),
      kernel_max_bytes_(kernel_path_crossover(size)),
      split_bytes_(std::max<uint32_t>(ll_bytes_ + 1, static_cast<uint32_t>(std::min<uint64_t>(kSplitMaxBytes, slot_bytes / 2)))),
      block_bytes_(param_bytes("COMMLIB_DEVICE_BLOCK_BYTES")),
      imported_(size, nullptr), tracing_(device_trace_from_env()) {
  pool_staging_ = param_choice("COMMLIB_DEVICE_STAGING", {"pool", "slots"}) == "pool";
  if (mode_ == DevicePath::Kernel && device_->plan_blocks(1) == 0)
    throw std::invalid_argument("COMMLIB_DEVICE_PATH=kernel: " + device_->name() + " has no kernel path");
  setup_stream_ = device_->create_stream();
  region_ = static_cast<char*>(device_->allocate(region_bytes()));
  const size_t local_bytes = this->local_bytes();
  local_ = device_->allocate(local_bytes);
  const size_t ll_area = region_bytes() - 2 * flag_bytes() - slots_bytes();
  std::vector<char> zeros(std::max({2 * flag_bytes(), local_bytes, ll_area}), 0);
  // Once per engine: the flags (and the LL lines' flag halves) are zero before any peer sees the region.
  device_->upload_now(region_, zeros.data(), 2 * flag_bytes());
  if (ll_area) device_->upload_now(region_ + 2 * flag_bytes() + slots_bytes(), zeros.data(), ll_area);
  device_->upload_now(local_, zeros.data(), local_bytes);
  void* page = mmap(nullptr, kPageBytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (page == MAP_FAILED) throw std::runtime_error("kernel path: cannot map its host page");
  host_page_ = static_cast<char*>(page);
  host_page_dev_ = device_->map_host(host_page_, kPageBytes);
  staged_copied_ = device_->create_event();
  chain_event_ = device_->create_event();
  chain_ = LaunchChain::of(*device_);
  chain_->join();
}

KernelPath::~KernelPath() {
  try {
    DeviceGuard guard(*device_);  // the last reference may go on any thread (issue #23: no stray context)
    close_imports();
    if (setup_stream_) release(*setup_stream_, false);
    if (host_page_) device_->unmap_host(host_page_);  // kept until now: see release()
    if (host_page_) munmap(host_page_, kPageBytes);
  } catch (...) {
  }
}

std::string KernelPath::local_handle() const {
  return std::string(device_path_name(mode_)) + "," + std::to_string(ll_bytes_) + "," +
         std::to_string(kernel_max_bytes_) + "," + std::to_string(block_bytes_) + (pool_staging_ ? ",pool" : ",slots") + setup_fields() + ":" + device_->export_memory(region_);
}

void KernelPath::connect(const std::vector<std::string>& handles, bool one_host) {
  const std::string mine = std::to_string(ll_bytes_), my_max = std::to_string(kernel_max_bytes_);
  std::vector<std::string> tables(size_), residencies(size_);
  for (size_t p = 0; p < handles.size(); ++p) {
    std::vector<std::string> f;  // mode, LL bytes, crossover, block bytes, staging, peer buffers' table, residency
    const std::string head = handles[p].substr(0, handles[p].find(':'));
    for (size_t at = 0, c = 0; c != std::string::npos; at = c + 1) f.push_back(head.substr(at, (c = head.find(',', at)) - at));
    if (f.size() != 7) throw std::invalid_argument("kernel path: malformed handle of rank " + std::to_string(p));
    const std::string &theirs = f[1], &their_max = f[2], &their_block = f[3];
    tables[p] = f[5];
    residencies[p] = f[6];
    if (f[4] != (pool_staging_ ? "pool" : "slots"))  // every rank grows its staging arena at the same calls
      throw std::invalid_argument("COMMLIB_DEVICE_STAGING: rank " + std::to_string(p) + " uses " + f[4] + ", rank " +
                                  std::to_string(rank_) + " " + (pool_staging_ ? "pool" : "slots") +
                                  "; every rank must use the same");
    if (their_block != std::to_string(block_bytes_))  // one-sided plans: the grid, hence the flags' meaning
      throw std::invalid_argument("COMMLIB_DEVICE_BLOCK_BYTES: rank " + std::to_string(p) + " uses " + their_block +
                                  ", rank " + std::to_string(rank_) + " " + std::to_string(block_bytes_) +
                                  "; every rank must use the same");
    if (theirs != mine)  // the regions' layout depends on it
      throw std::invalid_argument("COMMLIB_DEVICE_LL_BYTES: rank " + std::to_string(p) + " uses " + theirs + ", rank " +
                                  std::to_string(rank_) + " " + mine + "; every rank must use the same");
    if (mode_ == DevicePath::Auto && their_max != my_max)  // else ranks would take different paths for one call
      throw std::invalid_argument("COMMLIB_TUNING: rank " + std::to_string(p) + " takes the kernel path up to " +
                                  their_max + " bytes, rank " + std::to_string(rank_) + " up to " + my_max +
                                  " (the tuning files' \"device_path\" crossovers differ); every rank must load the same");
  }
  usable_ = one_host && mode_ != DevicePath::Copy && device_->plan_blocks(1) > 0;
  connect_setup(tables, residencies, one_host);  // may refuse (usable_ false, or a throw naming why)
  if (!usable_) return;
  std::vector<PeerView> views(size_, PeerView{nullptr, nullptr, nullptr, nullptr, nullptr, nullptr});
  std::vector<char*> staging(size_, region_ + 2 * flag_bytes());
  for (int p = 0; p < size_; ++p) {
    if (p == rank_) continue;
    const std::string& h = handles[p];
    imported_[p] = static_cast<char*>(device_->import_memory(h.substr(h.find(':') + 1)));
    views[p] = PeerView{imported_[p] + 2 * flag_bytes(), reinterpret_cast<uint64_t*>(imported_[p]),
                        reinterpret_cast<uint64_t*>(imported_[p] + flag_bytes()),
                        reinterpret_cast<uint64_t*>(imported_[p] + 2 * flag_bytes() + slots_bytes()),
                        reinterpret_cast<uint64_t*>(imported_[p] + descs_offset()),
                        reinterpret_cast<uint64_t*>(imported_[p] + os_flags_offset())};
    staging[p] = imported_[p] + 2 * flag_bytes();
  }
  staged_peers_ = std::make_unique<StagedPeerBuffers>(std::move(staging), rank_, staging_capacity());
  char* views_dev = static_cast<char*>(local_) + views_offset();
  device_->upload_now(views_dev, views.data(), views.size() * sizeof(PeerView));
}

void KernelPath::stage(const std::vector<char>& bytes, void* dev, DeviceStream& stream) {
  const size_t need = round_up(bytes.size(), kLine);
  if (staged_ && device_->query(*staged_copied_)) staged_ = 0;  // every copy out of the arena ran
  if (staged_ + need > staging_.bytes) {
    if (staging_.host) retired_staging_.push_back(staging_);
    const size_t size = round_up(std::max({need, 2 * staging_.bytes, kMinStaging}), kPageBytes);
    void* host = mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (host == MAP_FAILED) throw std::runtime_error("kernel path: cannot map a staging area for its plans");
    staging_ = Staging{static_cast<char*>(host), size};
    staged_ = 0;
    device_->map_host(staging_.host, size);  // pinned: the copy below never waits for the stream
  }
  char* from = staging_.host + staged_;
  std::memcpy(from, bytes.data(), bytes.size());
  device_->copy(dev, from, bytes.size(), stream);
  device_->record(*staged_copied_, stream);
  staged_ += need;
}

const KernelPath::Uploaded& KernelPath::upload(const ScheduleKey& key, const Schedule& sched, DeviceStream& stream) {
  ++plan_lookups_;
  auto it = plans_.find(key);
  if (it != plans_.end()) return it->second;
  if (plans_.size() >= kMaxPlans) {
    // Every plan leaves the cache, on every rank alike (the cache's contents are a function of the
    // calls, which every rank makes alike, so has_plan answers a capture alike on every rank,
    // whatever graphs each rank still holds). Stream-ordered frees: after the launches that use
    // them (earlier calls, which this call's stream already waits for), without waiting for the
    // device here (a cudaFree would, and a stream may be parked in a wait for a peer that waits
    // for this host). A plan a graph holds is kept, out of the cache, until no graph holds it
    // (its replays read it).
    for (auto& [k, u] : plans_) {
      if (u.pin.use_count() > 1)
        held_plans_.push_back(std::move(u));
      else
        device_->free_ordered(u.dev, stream);
    }
    plans_.clear();
    ++plans_generation_;
    for (auto h = held_plans_.begin(); h != held_plans_.end();) {
      if (h->pin.use_count() > 1) {
        ++h;
        continue;
      }
      device_->free_ordered(h->dev, stream);
      h = held_plans_.erase(h);
    }
  }
  Uploaded u;
  u.plan = lower_schedule(sched, rank_, size_, key.elem_bytes, slot_bytes_);
  const DevicePlan& p = u.plan;
  if (p.one_sided) {  // the arrivals' words are none of its business; it runs every item on every block
    std::vector<char> host;
    host.reserve(p.items.size() * sizeof(kplan::PlanItem) + 4096);
    plan_one_sided(key, u, host);
    u.dev = device_->allocate_ordered(host.size(), stream);
    stage(host, u.dev, stream);
    for (int q = 0; q < size_; ++q) u.has_peers |= q != rank_ && (p.sends_to[q] | p.recvs_from[q]) != 0;
    for (const kplan::PlanItem& it : p.items)
      if (it.kind == kplan::kWait) {  // the watchdog's view: the launch first waits for this peer
        u.first_peer = it.peer;
        break;
      }
    return plans_.emplace(key, std::move(u)).first->second;
  }
  const size_t items = p.items.size() * sizeof(kplan::PlanItem), steps = p.steps.size() * sizeof(kplan::PlanStep),
               counts = size_ * sizeof(uint32_t);
  const size_t arrivals = round_up(items + steps + 2 * counts, 8);  // zeros: the split items' counters
  std::vector<char> host(arrivals + p.items.size() * sizeof(uint64_t) + 16, 0);
  std::memcpy(host.data(), p.items.data(), items);
  std::memcpy(host.data() + items, p.steps.data(), steps);
  std::memcpy(host.data() + items + steps, p.sends_to.data(), counts);
  std::memcpy(host.data() + items + steps + counts, p.recvs_from.data(), counts);
  u.dev = device_->allocate_ordered(host.size(), stream);  // once per call shape, in the call's order
  stage(host, u.dev, stream);
  u.every_peer = true;
  for (int q = 0; q < size_; ++q) {
    const bool peer = q != rank_ && (p.sends_to[q] | p.recvs_from[q]) != 0;
    u.has_peers |= peer;
    u.every_peer &= q == rank_ || peer;
  }
  u.small = ll_bytes_ != 0;
  for (const kplan::PlanItem& it : p.items) {
    u.has_split |= it.bytes >= split_bytes_;
    u.small &= it.bytes <= ll_bytes_;
  }
  for (const kplan::PlanItem& it : p.items)
    if (it.kind == kplan::kSend || it.kind == kplan::kRecv || it.kind == kplan::kRecvReduce) {
      u.first_peer = it.peer;
      u.first_is_send = it.kind == kplan::kSend;
      break;
    }
  return plans_.emplace(key, std::move(u)).first->second;
}

Launched KernelPath::enqueue(const PathCall& pc, DeviceStream& stream) {
  const CallDesc& d = pc.desc;
  const ScheduleKey key{d.coll, static_cast<uint8_t>(d.algo & ~kDeviceCallAlgoBit), d.root, d.count,
                        static_cast<uint8_t>(dtype_size(pc.call.dtype))};  // the resolved algorithm
  return launch(key, pc.plan.device_sched(), d, pc.bases, pc.call.dtype, pc.call.op, stream, pc.captured, pc.mapped,
                pc.plan_slot);
}

Launched KernelPath::launch(const ScheduleKey& key, const Schedule& sched, const CallDesc& desc, char* const bases[3],
                            DType dtype, RedOp op, DeviceStream& stream, bool captured, const MappedPeers* mapped,
                            KernelPlanSlot* slot) {
  if (captured && !has_plan(key)) throw std::logic_error("kernel path: a captured launch without its plan");
  // A prepared call's plan as its first launch found it, while no plan left the cache since.
  const bool kept = slot && slot->path == this && slot->generation == plans_generation_;
  const Uploaded& u = kept ? *static_cast<const Uploaded*>(slot->plan) : upload(key, sched, stream);
  if (slot && !kept) *slot = KernelPlanSlot{this, &u, plans_generation_};
  if (captured) {
    device_->retain_in_capture(stream, u.pin);
    captured_any_.store(true, std::memory_order_relaxed);
  }
  const DevicePlan& p = u.plan;
  if (p.steps.empty()) return Launched{};
  // A small call (every item takes LL, or is as small) runs on one block: its items are a few
  // lines each, so more blocks would only add grid barriers (plan_kernel.cuh).
  // A one-sided plan's grid is fixed when it is uploaded, the same on every rank (plan_one_sided).
  const unsigned blocks = p.one_sided ? u.os_grid
                                      : launch_blocks(u.small       ? 1u
                                                      : u.has_split ? kexec::kMaxBlocks
                                                                    : std::max(1u, p.widest_step));
  char* dev = static_cast<char*>(u.dev);
  const size_t items = p.items.size() * sizeof(kplan::PlanItem), steps = p.steps.size() * sizeof(kplan::PlanStep);
  char* local = static_cast<char*>(local_);
  PlanLaunch a{};
  a.items = reinterpret_cast<const kplan::PlanItem*>(dev);
  a.steps = reinterpret_cast<const kplan::PlanStep*>(dev + items);
  a.sends_to = reinterpret_cast<const uint32_t*>(dev + items + steps);
  a.recvs_from = a.sends_to + size_;
  a.arrivals = reinterpret_cast<uint64_t*>(dev + round_up(items + steps + 2 * size_ * sizeof(uint32_t), 8));
  a.nitems = static_cast<uint32_t>(p.items.size());
  a.split_bytes = u.has_split ? split_bytes_ : 0;
  a.peers = reinterpret_cast<const PeerView*>(local + views_offset());
  for (int b = 0; b < 3; ++b) a.bases[b] = bases[b];
  a.ready = reinterpret_cast<uint64_t*>(region_);
  a.freed = reinterpret_cast<uint64_t*>(region_ + flag_bytes());
  a.slots = region_ + 2 * flag_bytes();
  a.ll = reinterpret_cast<uint64_t*>(region_ + 2 * flag_bytes() + slots_bytes());
  a.ll_stage = local + views_offset() + round_up(size_ * sizeof(PeerView), kLine);
  a.ll_bytes = ll_bytes_;
  a.sent = reinterpret_cast<uint64_t*>(local);
  a.received = a.sent + size_;
  a.barrier = reinterpret_cast<uint64_t*>(local + barrier_offset());
  a.abort = host_page_dev_;
  a.progress = host_page_dev_ + kProgressWord;
  a.done = host_page_dev_ + kDoneWord;
  a.replays_done = host_page_dev_ + kReplaysDoneWord;
  a.replays_started = host_page_dev_ + kReplaysStartedWord;
  a.chunk_counts = reinterpret_cast<uint64_t*>(local + chunk_counts_offset());
  std::memcpy(a.desc, &desc, sizeof desc);
  a.descs = reinterpret_cast<uint64_t*>(region_ + descs_offset());
  a.checked = a.sent + 2 * size_;
  a.mismatch = host_page_dev_ + kMismatchWord;
  a.desc_ring_len = u.has_peers ? desc_ring_len() : 0;  // a plan without peers checks nothing
  // One block whose plan joins every other rank: the check rides on the data handshakes
  // (plan_call_check.cuh says why a mismatched call still writes nothing then).
  a.fold_check = !p.one_sided && u.has_peers && u.every_peer && blocks == 1 && size_ <= 64 ? 1 : 0;
  a.captured = captured ? 1 : 0;
  a.slot_bytes = slot_bytes_;
  a.nsteps = static_cast<uint32_t>(p.steps.size());
  a.nslots = nslots_;
  a.rank = rank_;
  a.size = size_;
  a.trace = trace_buffer();  // null unless COMMLIB_DEVICE_TRACE=1 (kernels/plan_trace.cuh)
  if (p.one_sided) fill_one_sided(a, u, bases, captured ? nullptr : mapped, captured, stream);
  launch_in_chain(a, blocks, dtype, op, p.reduces, stream, captured);
  if (captured) return Launched{};  // the graph's replays: the engine does not watch them
  ++launches_;
  // The done word (plan_kernel.cuh, end_launch): the launch's last block to exit stores its number,
  // so reaching `launches_` is this call's completion, as an event's would be (the engine's works).
  return Launched{reinterpret_cast<const uint64_t*>(host_page_) + kDoneWord, launches_, u.first_peer, u.first_is_send,
                  host_page_dev_ + kDoneWord};
}

void KernelPath::close_imports() {
  peer_buffers_->close();
  for (int p = 0; p < size_; ++p)
    if (imported_[p]) device_->close_import(imported_[p]);
  imported_.assign(size_, nullptr);
}

void KernelPath::release(DeviceStream& stream, bool free_region) {
  if (!setup_stream_) return;
  close_imports();
  for (auto& [k, u] : plans_) device_->free_ordered(u.dev, stream);
  for (Uploaded& u : held_plans_) device_->free_ordered(u.dev, stream);
  plans_.clear();
  held_plans_.clear();
  ++plans_generation_;
  release_mapped_tables(stream);
  if (region_ && free_region) device_->free_async(region_, stream);
  if (arena_.base) retired_arenas_.push_back(std::move(arena_));
  for (Arena& a : retired_arenas_) {  // exported as the region is: freed only when every peer closed its imports
    free_arena_tables(a, stream);
    if (free_region) device_->free_async(a.base, stream);
  }
  for (char* a : unshared_arenas_)
    if (free_region) device_->free_async(a, stream);
  retired_arenas_.clear();
  unshared_arenas_.clear();
  arena_ = Arena{};
  if (local_) device_->free_async(local_, stream);
  if (trace_) device_->free_async(trace_, stream);
  region_ = nullptr;
  local_ = nullptr;
  trace_ = nullptr;
  device_->synchronize(stream);
  retired_staging_.push_back(staging_);  // every copy out of them ran (the engine's calls drained)
  for (const Staging& st : retired_staging_)
    if (st.host) {
      device_->unmap_host(st.host);
      munmap(st.host, st.bytes);
    }
  retired_staging_.clear();
  staging_ = Staging{};
  staged_ = 0;
  // The host page (done word) stays until the path goes: a work kept after close reads it (final).
  setup_stream_.reset();
  claims_.release();  // the device-wide budget's blocks go back (grid_claims.h)
  if (chain_) chain_->leave(this);
  chain_.reset();
}

}  // namespace commlib
