// The stream engine's set-up, its control regions and the enqueueing of schedule steps (see
// stream_engine.h); connecting to the peers (links, mappings) is in stream_connect.cc, calls (planning, numbering, ordering) are in stream_calls.cc, point-to-point in
// stream_p2p.cc, the watchdog, the call descriptor check and failure handling in stream_watchdog.cc.
#include "stream/stream_engine.h"

#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>

#include "common/params.h"
#include "policy/auto_policy.h"
#include "schedule/registry.h"

namespace commlib {

namespace {

constexpr size_t kLine = 64;      // one counter per cache line: ranks write them concurrently
constexpr uint64_t kRing = 64;    // call descriptors kept per rank
constexpr size_t kRingSlot = 64;  // bytes per descriptor slot: seq (written last), CallDesc
constexpr size_t kP2PSlot = 64;  // seq (written last), CallDesc

}  // namespace

StreamEngineOptions stream_engine_options_from_env(double timeout_s, const std::string& label) {
  StreamEngineOptions o;
  o.timeout_s = timeout_s;
  o.label = label;
  o.slot_bytes = param_bytes("COMMLIB_DEVICE_SLOT_BYTES");
  if (o.slot_bytes != 0 && (o.slot_bytes < 64 || o.slot_bytes > (uint64_t{1} << 30) || o.slot_bytes % 64))
    throw std::invalid_argument("COMMLIB_DEVICE_SLOT_BYTES: must be 0 (auto) or a multiple of 64 in [64, 2^30], got " +
                                std::to_string(o.slot_bytes));
  o.nslots = static_cast<uint32_t>(param_int("COMMLIB_DEVICE_SLOTS", 1, 64));
  o.streams = static_cast<int>(param_int("COMMLIB_DEVICE_STREAMS", 1, 2));
  o.path = device_path_from_env();
  o.link = device_link_setting_from_env();
  return o;
}

uint64_t auto_slot_bytes(int ranks, uint32_t nslots) {
  constexpr uint64_t kMin = 256 << 10, kMax = 4 << 20;
  const uint64_t share = kAutoInboxBytes / (static_cast<uint64_t>(std::max(ranks, 1)) * std::max(nslots, 1u));
  uint64_t slot = kMax;
  while (slot > kMin && slot > share) slot /= 2;  // the largest power of two within the share
  return slot;
}

namespace {

// The options with slot_bytes 0 resolved (the same on every rank: every rank has the same size).
StreamEngineOptions resolved(StreamEngineOptions o, int ranks) {
  if (o.slot_bytes == 0) o.slot_bytes = auto_slot_bytes(ranks, o.nslots);
  return o;
}

}  // namespace

// Control region: three counter lines per peer (ready, freed, called), the call-descriptor ring,
// the point-to-point descriptor rings, the stop word's line.
constexpr int kFlagKinds = 3;

size_t StreamEngine::ctl_bytes() const {
  return kFlagKinds * static_cast<size_t>(size_) * kLine + kRing * kRingSlot +
         static_cast<size_t>(size_) * kP2PRing * kP2PSlot + kLine;
}

uint64_t* StreamEngine::stop_word(char* ctl) const { return reinterpret_cast<uint64_t*>(ctl + ctl_bytes() - kLine); }

char* StreamEngine::p2p_slot(char* ctl, int peer, uint64_t k) const {
  return ctl + kFlagKinds * static_cast<size_t>(size_) * kLine + kRing * kRingSlot +
         (static_cast<size_t>(peer) * kP2PRing + k % kP2PRing) * kP2PSlot;
}

uint64_t* StreamEngine::flag(char* ctl, int which, int peer) const {
  return reinterpret_cast<uint64_t*>(ctl + (static_cast<size_t>(which) * size_ + peer) * kLine);
}

char* StreamEngine::ring_slot(char* ctl, uint64_t seq) const {
  return ctl + kFlagKinds * static_cast<size_t>(size_) * kLine + (seq % kRing) * kRingSlot;
}

StreamEngine::StreamEngine(std::shared_ptr<Device> device, std::unique_ptr<PeerControl> control, PlanContext plan,
                           StreamEngineOptions opts)
    : device_(std::move(device)),
      control_(std::move(control)),
      rank_(plan.rank),
      size_(plan.size),
      opts_(resolved(std::move(opts), plan.size)),
      peers_(size_),
      links_(size_),
      sent_(size_, 0),
      received_(size_, 0),
      p2p_sent_(size_, 0),
      p2p_received_(size_, 0),
      plans_(std::move(plan)),
      nccl_(std::make_unique<NcclLink>(device_, rank_, size_, opts_.timeout_s)) {
  for (int p = 0; p < size_; ++p)
    if (p != rank_) all_peers_.push_back(p);
  ctl_fd_ = memfd_create("commlib-device-ctl", MFD_CLOEXEC);
  if (ctl_fd_ < 0 || ftruncate(ctl_fd_, static_cast<off_t>(ctl_bytes())) != 0)
    throw std::runtime_error(std::string("stream engine: control region: ") + std::strerror(errno));
  void* p = mmap(nullptr, ctl_bytes(), PROT_READ | PROT_WRITE, MAP_SHARED, ctl_fd_, 0);
  if (p == MAP_FAILED) throw std::runtime_error(std::string("stream engine: mmap: ") + std::strerror(errno));
  ctl_ = static_cast<char*>(p);
  DeviceGuard guard(*device_);
  ctl_dev_ = device_->map_host(ctl_, ctl_bytes());
  inbox_ = device_->allocate(static_cast<size_t>(size_) * opts_.nslots * opts_.slot_bytes);
  own_stream_ = device_->create_stream();
  events_ = std::make_unique<EventPool>(*device_);
  if (opts_.streams == 2) {
    send_stream_ = device_->create_stream();
    recv_stream_ = device_->create_stream();
    fork_ = device_->create_event();
    sent_step_ = device_->create_event();
    received_step_ = device_->create_event();
  }
  if (opts_.path != DevicePath::Copy)
    kernel_ = std::make_unique<KernelPath>(device_, rank_, size_, opts_.nslots, opts_.slot_bytes, opts_.path);
  watchdog_ = std::thread([this] { watchdog_loop(); });
  // The host side's abort fails this engine too (its peers were told by the host side, and its
  // caller by the host call that failed or the user's abort: reported).
  host_listener_ = control_->on_host_abort([this](ErrorKind kind, const std::string& msg) {
    if (!failed()) reported_.store(true, std::memory_order_release);
    fail(kind, msg, false);
  });
  // The engine may outlive its communicator (a work handle holds it): it closes with it, while
  // the communicator's transport, which the watchdog and the host functions read, is still up.
  close_listener_ = control_->on_host_close([this] {
    close();
    host_gone_.store(true, std::memory_order_release);
  });
}

StreamEngine::~StreamEngine() {
  try {
    close();
    release_memory(false);  // without the peers' word: the exported inbox is left allocated
  } catch (...) {
  }
}

std::string StreamEngine::local_handle() const {
  DeviceGuard guard(*device_);
  // ctl:<pid>:<fd>:<bytes>;slots:<nslots>:<slot_bytes>;inbox:<device handle>
  return "ctl:" + std::to_string(getpid()) + ":" + std::to_string(ctl_fd_) + ":" + std::to_string(ctl_bytes()) +
         ";slots:" + std::to_string(opts_.nslots) + ":" + std::to_string(opts_.slot_bytes) +
         ";inbox:" + device_->export_memory(inbox_) +
         ";kernel:" + (kernel_ ? kernel_->local_handle() : std::string(device_path_name(opts_.path)) + ":");
}

char* StreamEngine::grow(void*& buf, size_t& have, size_t bytes, DeviceStream& s) {
  (void)s;
  if (bytes > have) {
    // No free here: freeing synchronises the device like cudaFree, while this rank's streams may
    // be parked in waits on peers (a deadlock). The old buffer is retired until close; growing
    // geometrically keeps the retired ones smaller than the live one together.
    const size_t want = std::max(bytes, 2 * have);
    if (buf) retired_.push_back(buf);
    buf = nullptr;
    have = 0;
    buf = device_->allocate(want);
    have = want;
  }
  return static_cast<char*>(buf);
}

void StreamEngine::send_chunk(int p, const char* src, size_t bytes, uint64_t seq, DeviceStream& s) {
  const uint64_t c = sent_[p]++;
  if (c >= opts_.nslots) {
    const uint64_t target = c - opts_.nslots + 1;
    {
      std::lock_guard<std::mutex> lk(mu_);
      waits_.push_back(Wait{flag(ctl_, 1, p), target, p, true, seq});
    }
    device_->wait_value(flag(reinterpret_cast<char*>(ctl_dev_), 1, p), target, s);
  }
  char* slot = peers_[p].inbox + (static_cast<size_t>(rank_) * opts_.nslots + c % opts_.nslots) * opts_.slot_bytes;
  if (bytes) device_->copy(slot, src, bytes, s);
  device_->write_value(flag(reinterpret_cast<char*>(peers_[p].ctl_dev), 0, rank_), c + 1, s);
}

void StreamEngine::recv_chunk(int q, char* dst, const char* src, size_t bytes, bool reduce, DType dtype, RedOp op,
                              uint64_t seq, DeviceStream& s) {
  const uint64_t c = received_[q]++;
  {
    std::lock_guard<std::mutex> lk(mu_);
    waits_.push_back(Wait{flag(ctl_, 0, q), c + 1, q, false, seq});
  }
  device_->wait_value(flag(reinterpret_cast<char*>(ctl_dev_), 0, q), c + 1, s);
  const char* slot = static_cast<char*>(inbox_) +
                     (static_cast<size_t>(q) * opts_.nslots + c % opts_.nslots) * opts_.slot_bytes;
  if (bytes) {  // skipped once the call's check failed or the engine failed (the stop word)
    if (!reduce) {
      device_->copy_unless(stop_dev(), dst, slot, bytes, s);
    } else {
      if (src && src != dst) device_->copy_unless(stop_dev(), dst, src, bytes, s);
      device_->reduce_unless(stop_dev(), dst, slot, bytes / dtype_size(dtype), dtype, op, s);
    }
  }
  device_->write_value(flag(reinterpret_cast<char*>(peers_[q].ctl_dev), 1, rank_), c + 1, s);
}

void StreamEngine::enqueue_step(const Step& step, char* const bases[3], size_t esize, DType dtype, RedOp op,
                                const CallDesc& desc, DeviceStream& send_s, DeviceStream& s) {
  auto resolve = [&](const Region& r) -> char* {
    char* base = bases[static_cast<int>(r.buf)];
    if (!base) {
      if (r.count == 0) return nullptr;
      throw CommError(std::string("internal error: schedule of ") + describe_call(desc) + " on rank " +
                      std::to_string(rank_) + " uses the " + buffer_name(r.buf) + " buffer, which this rank does not have");
    }
    return base + static_cast<size_t>(r.offset) * esize;
  };
  // Local operations first: the schedule guarantees they touch nothing the messages touch.
  for (const Op& o : step.ops) {
    const size_t bytes = static_cast<size_t>((o.kind == OpKind::Send ? o.src : o.dst).count) * esize;
    if (o.kind == OpKind::Copy && bytes) {
      char* d = resolve(o.dst);
      const char* src = resolve(o.src);
      if (d != src) device_->copy_unless(stop_dev(), d, src, bytes, s);
    } else if (o.kind == OpKind::Reduce && bytes) {
      device_->reduce_unless(stop_dev(), resolve(o.dst), resolve(o.src), bytes / esize, dtype, op, s);
    }
  }
  // Messages to peers over the nccl link: one NCCL group, before the peer-memory chunks.
  if (nccl_->carries_any()) nccl_->enqueue_step(step, resolve, esize, dtype, op, s);  // its grouped() peers
  const size_t chunk = std::max<size_t>(opts_.slot_bytes / esize * esize, esize);
  auto chunks = [&](size_t bytes) { return bytes ? (bytes + chunk - 1) / chunk : 1; };
  size_t rounds = 0;
  for (const Op& o : step.ops)
    if ((o.kind == OpKind::Send || o.kind == OpKind::Recv || o.kind == OpKind::RecvReduce) && !grouped(o.peer))
      rounds = std::max(rounds, chunks(static_cast<size_t>((o.kind == OpKind::Send ? o.src : o.dst).count) * esize));
  for (size_t i = 0; i < rounds; ++i) {
    for (const Op& o : step.ops) {  // chunk i of every send, then of every receive (see header)
      if (o.kind != OpKind::Send || grouped(o.peer)) continue;
      const size_t bytes = static_cast<size_t>(o.src.count) * esize;
      if (i >= chunks(bytes)) continue;
      const size_t off = i * chunk, n = std::min(chunk, bytes - std::min(bytes, off));
      send_chunk(o.peer, resolve(o.src) + (bytes ? off : 0), n, seq_, send_s);
    }
    for (const Op& o : step.ops) {
      if ((o.kind != OpKind::Recv && o.kind != OpKind::RecvReduce) || grouped(o.peer)) continue;
      const size_t bytes = static_cast<size_t>(o.dst.count) * esize;
      if (i >= chunks(bytes)) continue;
      const size_t off = i * chunk, n = std::min(chunk, bytes - std::min(bytes, off));
      char* d = resolve(o.dst);
      const char* src = reduces_from_src(o) ? resolve(o.src) : nullptr;
      recv_chunk(o.peer, d ? d + off : nullptr, src ? src + off : nullptr, n, o.kind == OpKind::RecvReduce, dtype, op,
                 seq_, s);
    }
  }
}

void StreamEngine::close() {
  // Always returns: a device error on the way (a sticky CUDA error) fails the engine instead of
  // throwing, and the watchdog is joined whatever happened.
  if (const int id = close_listener_.exchange(0)) control_->remove_close_listener(id);
  std::lock_guard<std::mutex> closing(close_mu_);
  {
    std::lock_guard<std::mutex> guard(enqueue_mu_);
    if (closed_) return;
    closed_ = true;
  }
  auto attempt = [this](const char* what, auto&& fn) {
    try {
      fn();
    } catch (const std::exception& e) {
      fail_device(std::string("close (") + what + ")", e);
    }
  };
  std::unique_ptr<DeviceGuard> guard;
  attempt("current device", [&] { guard = std::make_unique<DeviceGuard>(*device_); });
  if (last_done_) attempt("synchronize", [&] { device_->synchronize(*last_done_); });  // the watchdog releases a stuck stream
  attempt("nccl", [&] { nccl_->close(); });
  if (host_listener_) control_->remove_host_listener(host_listener_);
  host_listener_ = 0;
  if (p2p_probe_) control_->remove_p2p_probe(p2p_probe_);  // before the control region goes
  p2p_probe_ = 0;
  {
    std::lock_guard<std::mutex> lk(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  if (watchdog_.joinable()) watchdog_.join();
  // A host function's error the watchdog had no tick left to act on (the call's last one found a
  // mismatch just before close): the engine fails with it now, so close reports it.
  ErrorKind pending_kind = ErrorKind::None;
  std::string pending;
  {
    std::lock_guard<std::mutex> lk(mu_);
    if (stream_failure_ && !failed()) {
      pending_kind = stream_fail_kind_;
      pending = stream_fail_message_;
    }
    stream_failure_ = false;
  }
  if (!pending.empty()) fail(pending_kind, pending);
  // Imports first (issue #23, item 7): the peers' memory is theirs to free once every rank has
  // closed its imports (release_memory, after the Python side's barrier).
  for (Peer& p : peers_) {
    if (p.inbox) attempt("close import", [&] { device_->close_import(p.inbox); });
    if (p.ctl) {
      attempt("unmap", [&] { device_->unmap_host(p.ctl); });
      munmap(p.ctl, p.ctl_bytes);
    }
    p = Peer{};
  }
  if (kernel_) attempt("kernel path imports", [&] { kernel_->close_imports(); });
  attempt("remote staging", [&] { close_remote_staging(); });
}

void StreamEngine::release_memory(bool peers_closed) {
  {
    std::lock_guard<std::mutex> guard(enqueue_mu_);
    if (!closed_ || released_) return;
    released_ = true;
  }
  auto attempt = [this](const char* what, auto&& fn) {
    try {
      fn();
    } catch (const std::exception& e) {
      fail_device(std::string("release (") + what + ")", e);
    }
  };
  std::unique_ptr<DeviceGuard> guard;
  attempt("current device", [&] { guard = std::make_unique<DeviceGuard>(*device_); });
  // The inbox is exported: freed only when every peer closed its import of it and nothing
  // failed (a peer that failed may still map it: leaked rather than freed under it).
  if (peers_closed && !failed()) attempt("free inbox", [&] { device_->free_async(inbox_, *own_stream_); });
  attempt("free scratch", [&] {
    device_->free_async(scratch_, *own_stream_);
    device_->free_async(input_copy_, *own_stream_);
    for (void* b : retired_) device_->free_async(b, *own_stream_);
    retired_.clear();
  });
  // The kernel region is exported like the inbox: freed on the same condition.
  if (kernel_) attempt("kernel path", [&] { kernel_->release(*own_stream_, peers_closed && !failed()); });
  attempt("synchronize", [&] { device_->synchronize(*own_stream_); });
  own_stream_.reset();  // its thread ends now, not when the last work handle goes
  {
    std::lock_guard<std::mutex> lk(mu_);  // the calls drained (close): their events go with their works
    in_flight_.clear();
    waits_.clear();
  }
  last_done_.reset();
  last_done_stream_ = nullptr;
  events_->clear();
  send_stream_.reset();
  recv_stream_.reset();
  inbox_ = scratch_ = input_copy_ = nullptr;
  if (ctl_) {
    attempt("unmap", [&] { device_->unmap_host(ctl_); });
    munmap(ctl_, ctl_bytes());
    ctl_ = nullptr;
  }
  if (ctl_fd_ >= 0) ::close(ctl_fd_);
  ctl_fd_ = -1;
}

}  // namespace commlib
