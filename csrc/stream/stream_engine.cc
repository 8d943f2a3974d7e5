// The stream engine's set-up, close and release (see stream_engine.h); connecting to the peers
// (links, mappings) is in stream_connect.cc, calls (planning, numbering, ordering) in
// stream_calls.cc, point-to-point in stream_p2p.cc, the watchdog and failure handling in
// stream_watchdog.cc, works in device_work.cc, the error no caller was told in stream_works.cc,
// capture mode in stream_capture.cc; the copy path is its own class (copy_path.h).
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
  o.codec_piece_bytes = static_cast<int64_t>(param_bytes("COMMLIB_COMPRESS_PIECE_BYTES"));
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

StreamEngine::StreamEngine(std::shared_ptr<Device> device, std::unique_ptr<PeerControl> control, PlanContext plan,
                           StreamEngineOptions opts)
    : device_(std::move(device)),
      control_(std::move(control)),
      rank_(plan.rank),
      size_(plan.size),
      opts_(resolved(std::move(opts), plan.size)),
      links_(size_),
      plans_(std::move(plan)),
      nccl_(std::make_unique<NcclLink>(device_, rank_, size_, opts_.timeout_s)) {
  DeviceGuard guard(*device_);
  copy_ = std::make_unique<CopyPath>(device_, static_cast<CopyPathHost&>(*this), *nccl_, rank_, size_, opts_.nslots,
                                     opts_.slot_bytes, opts_.streams);
  remote_descs_ = std::make_unique<RemoteDescriptors>(*device_, *nccl_, *copy_, static_cast<RemoteDescriptorsHost&>(*this),
                                                      failed_, rank_, size_);
  p2p_descs_ = std::make_unique<P2PDescriptors>(*copy_, *control_, static_cast<CopyPathHost&>(*this), failed_, rank_, size_);
  p2p_path_ = std::make_unique<P2PPath>(*device_, *copy_, *nccl_, *p2p_descs_, *remote_descs_,
                                        static_cast<CopyPathHost&>(*this), opts_.slot_bytes);
  own_stream_ = device_->create_stream();
  events_ = std::make_unique<EventPool>(*device_);
  if (opts_.path != DevicePath::Copy)
    kernel_ = std::make_unique<KernelPath>(device_, rank_, size_, opts_.nslots, opts_.slot_bytes, opts_.path,
                                           opts_.timeout_s);
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
  // <the copy path's handle>;kernel:<the kernel path's, or "<mode>:" without one>
  return copy_->local_handle() +
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
  // Before anything waits: peers waiting in a one-sided agreement for a call this rank never makes
  // stop now (PeerClosing), instead of waiting out the timeout while this rank's close waits for
  // them in the closing barrier (commlib/core/device_close.py).
  if (kernel_) attempt("closing mark", [&] { kernel_->peer_buffers().mark_closing(); });
  std::unique_ptr<DeviceGuard> guard;
  attempt("current device", [&] { guard = std::make_unique<DeviceGuard>(*device_); });
  // The last call's completion (its done word or event): the watchdog releases a stuck stream.
  if (!last_done_.captured()) attempt("synchronize", [&] { wait_done(last_done_); });
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
  attempt("close imports", [&] { copy_->close_imports(); });
  if (kernel_) attempt("kernel path imports", [&] { kernel_->close_imports(); });
  attempt("remote staging", [&] { remote_descs_->close(*own_stream_); });
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
  if (peers_closed && !failed()) attempt("free inbox", [&] { copy_->free_inbox(*own_stream_); });
  attempt("free scratch", [&] {
    copy_->free_codec_staging(*own_stream_);  // stream-ordered, before the synchronize below
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
  last_done_ = Completion{};
  last_done_stream_ = nullptr;
  events_->clear();
  scratch_ = input_copy_ = nullptr;
  attempt("control region", [&] { copy_->release(); });
}

}  // namespace commlib
