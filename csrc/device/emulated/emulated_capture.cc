// Stream capture and graphs on the emulated device (emulated_capture.h): the capture sequences,
// the unsafe-call rules and the graph's replay. The device's own capture calls are at the end.
#include "device/emulated/emulated_capture.h"

#include <algorithm>
#include <condition_variable>
#include <stdexcept>

#include "device/emulated/emulated_device.h"

namespace commlib {

namespace {

std::mutex g_mu;
std::vector<std::shared_ptr<EmulatedCapture>> g_active;  // captures in progress
std::atomic<uint64_t> g_next_id{1};
thread_local CaptureMode t_mode = CaptureMode::Global;  // cudaThreadExchangeStreamCaptureMode's
thread_local const std::atomic<bool>* t_abandon = nullptr;
thread_local const std::atomic<bool>* t_faulted = nullptr;

[[noreturn]] void invalidated_error(const std::string& why) {
  throw std::runtime_error("cudaErrorStreamCaptureInvalidated (emulated): the stream capture was invalidated by an "
                           "earlier error (" + why + ")");
}

EmulatedStream& emu(DeviceStream& s) { return static_cast<EmulatedStream&>(s); }

}  // namespace

uint32_t EmulatedCapture::add(CapturedOp op) {
  std::lock_guard<std::mutex> lk(mu_);
  if (invalidated_) invalidated_error(why_);
  if (ended_) throw std::logic_error("emulated capture: a node added after its end");
  ops_.push_back(std::move(op));
  return static_cast<uint32_t>(ops_.size() - 1);
}

uint32_t EmulatedCapture::lane_of(EmulatedStream* s) {
  std::lock_guard<std::mutex> lk(mu_);
  for (size_t i = 0; i < lanes_.size(); ++i)
    if (lanes_[i] == s) return static_cast<uint32_t>(i);
  lanes_.push_back(s);
  return static_cast<uint32_t>(lanes_.size() - 1);
}

void EmulatedCapture::forget_lane(EmulatedStream* s) {
  std::lock_guard<std::mutex> lk(mu_);
  for (auto& l : lanes_)
    if (l == s) l = nullptr;
}

void EmulatedCapture::invalidate(const std::string& why) {
  std::lock_guard<std::mutex> lk(mu_);
  if (!invalidated_) why_ = why;
  invalidated_ = true;
}

bool EmulatedCapture::invalidated(std::string* why) {
  std::lock_guard<std::mutex> lk(mu_);
  if (why) *why = why_;
  return invalidated_;
}

bool EmulatedCapture::ended() {
  std::lock_guard<std::mutex> lk(mu_);
  return ended_;
}

void EmulatedCapture::retain(std::shared_ptr<void> keep) {
  std::lock_guard<std::mutex> lk(mu_);
  if (invalidated_) invalidated_error(why_);
  retained_.push_back(std::move(keep));
}

EmulatedCapture::Taken EmulatedCapture::end() {
  std::lock_guard<std::mutex> lk(mu_);
  ended_ = true;
  return Taken{std::move(ops_), lanes_, std::move(retained_)};
}

std::shared_ptr<EmulatedCapture> emulated_register_capture(CaptureMode mode, EmulatedStream* origin) {
  auto c = std::make_shared<EmulatedCapture>(g_next_id.fetch_add(1), mode, origin);
  std::lock_guard<std::mutex> lk(g_mu);
  g_active.push_back(c);
  return c;
}

void emulated_unregister_capture(const std::shared_ptr<EmulatedCapture>& c) {
  std::lock_guard<std::mutex> lk(g_mu);
  g_active.erase(std::remove(g_active.begin(), g_active.end(), c), g_active.end());
}

void emulated_check_capture_safe(const char* what) {
  if (t_mode == CaptureMode::Relaxed) return;
  std::vector<std::shared_ptr<EmulatedCapture>> prohibiting;
  {
    std::lock_guard<std::mutex> lk(g_mu);
    if (g_active.empty()) return;
    const auto me = std::this_thread::get_id();
    for (const auto& c : g_active) {
      const bool own = c->thread == me && c->mode != CaptureMode::Relaxed;
      const bool others_global = c->thread != me && c->mode == CaptureMode::Global && t_mode == CaptureMode::Global;
      if (own || others_global) prohibiting.push_back(c);
    }
  }
  if (prohibiting.empty()) return;
  std::string which;
  for (const auto& c : prohibiting) {
    const std::string why = std::string(what) + " during the capture";
    c->invalidate(why);
    which += (which.empty() ? "" : ", ") + std::string("capture ") + std::to_string(c->id) + " (" +
             capture_mode_name(c->mode) + " mode" + (c->thread == std::this_thread::get_id() ? ", this thread's" : ", another thread's") + ")";
  }
  throw std::runtime_error(std::string("cudaErrorStreamCaptureUnsupported (emulated): ") + what +
                           " is not permitted while a stream capture prohibits potentially unsafe calls: " + which +
                           " is invalidated (this thread's capture mode: " + capture_mode_name(t_mode) + ")");
}

CaptureMode emulated_exchange_capture_mode(CaptureMode mode) {
  const CaptureMode previous = t_mode;
  t_mode = mode;
  return previous;
}

const std::atomic<bool>* emulated_running_abandon() { return t_abandon; }
const std::atomic<bool>* emulated_running_faulted() { return t_faulted; }

void emulated_set_running_stream(const std::atomic<bool>* abandon, const std::atomic<bool>* faulted) {
  t_abandon = abandon;
  t_faulted = faulted;
}

void run_captured_graph(const EmulatedGraphBody& g) {
  const std::atomic<bool>* abandon = t_abandon;
  const std::atomic<bool>* faulted = t_faulted;
  std::mutex mu;
  std::condition_variable cv;
  std::vector<uint8_t> done(g.ops.size(), 0);
  auto lane = [&](uint32_t l) {
    emulated_set_running_stream(abandon, faulted);
    for (size_t i = 0; i < g.ops.size(); ++i) {
      const CapturedOp& op = g.ops[i];
      if (op.lane != l) continue;
      {
        std::unique_lock<std::mutex> lk(mu);
        cv.wait(lk, [&] {
          return std::all_of(op.deps.begin(), op.deps.end(), [&](uint32_t d) { return done[d] != 0; });
        });
      }
      if (op.always || !(faulted && faulted->load(std::memory_order_acquire))) op.fn();
      {
        std::lock_guard<std::mutex> lk(mu);
        done[i] = 1;
      }
      cv.notify_all();
    }
  };
  std::vector<std::thread> others;
  for (uint32_t l = 1; l < g.lanes; ++l) others.emplace_back(lane, l);
  lane(0);
  for (std::thread& t : others) t.join();
}

void emulated_capture_conflict(const std::shared_ptr<EmulatedCapture>& c, const std::string& error,
                               const std::string& what) {
  if (c) c->invalidate(what);
  throw std::runtime_error(error + " (emulated): " + what + (c ? "; the capture is invalidated" : ""));
}

// ---------------------------------------------------------------------------------------------
// The device's capture calls

void EmulatedDevice::begin_capture(DeviceStream& stream, CaptureMode mode) {
  enter("cudaStreamBeginCapture");
  if (emu(stream).capture())
    throw std::runtime_error("cudaErrorIllegalState (emulated): cudaStreamBeginCapture on a stream already capturing");
  emu(stream).start_capture(emulated_register_capture(mode, &emu(stream)), 0, {});
}

std::shared_ptr<DeviceGraph> EmulatedDevice::end_capture(DeviceStream& stream) {
  enter("cudaStreamEndCapture");
  const std::shared_ptr<EmulatedCapture> c = emu(stream).capture();
  if (!c) throw std::runtime_error("cudaErrorIllegalState (emulated): cudaStreamEndCapture on a stream not capturing");
  if (c->origin != &emu(stream))
    throw std::runtime_error("cudaErrorStreamCaptureUnmatched (emulated): cudaStreamEndCapture on a stream that "
                             "joined the capture, not the one that began it");
  if (c->mode != CaptureMode::Relaxed && c->thread != std::this_thread::get_id())
    throw std::runtime_error("cudaErrorStreamCaptureWrongThread (emulated): cudaStreamEndCapture from another thread "
                             "than cudaStreamBeginCapture's (" + std::string(capture_mode_name(c->mode)) + " mode)");
  EmulatedCapture::Taken t = c->end();
  std::vector<std::vector<uint32_t>> frontiers;
  for (EmulatedStream* s : t.lanes) frontiers.push_back(s ? s->stop_capture(c.get()) : std::vector<uint32_t>{});
  emulated_unregister_capture(c);
  std::string why;
  if (c->invalidated(&why)) invalidated_error(why);
  // Every forked stream must have joined back: its last nodes are ancestors of the origin's.
  std::vector<uint8_t> reached(t.ops.size(), 0);
  std::vector<uint32_t> todo = frontiers[0];
  while (!todo.empty()) {
    const uint32_t n = todo.back();
    todo.pop_back();
    if (reached[n]) continue;
    reached[n] = 1;
    for (uint32_t d : t.ops[n].deps) todo.push_back(d);
  }
  for (size_t l = 1; l < t.lanes.size(); ++l)
    for (uint32_t n : frontiers[l])
      if (!reached[n])
        throw std::runtime_error("cudaErrorStreamCaptureUnjoined (emulated): a stream forked into the capture (lane " +
                                 std::to_string(l) + ") was not joined back into the origin stream before "
                                 "cudaStreamEndCapture; the capture is discarded");
  auto body = std::make_shared<EmulatedGraphBody>();
  body->ops = std::move(t.ops);
  body->lanes = static_cast<uint32_t>(t.lanes.size());
  body->retained = std::move(t.retained);
  body->binds_at_launch =
      std::any_of(body->ops.begin(), body->ops.end(), [](const CapturedOp& op) { return bool(op.at_launch); });
  return std::make_shared<EmulatedGraph>(std::move(body));
}

CaptureStatus EmulatedDevice::capture_status(DeviceStream& stream, uint64_t* id) {
  enter("cudaStreamGetCaptureInfo");
  const std::shared_ptr<EmulatedCapture> c = emu(stream).capture();
  if (id) *id = c ? c->id : 0;
  if (!c) return CaptureStatus::None;
  return c->invalidated() ? CaptureStatus::Invalidated : CaptureStatus::Active;
}

CaptureMode EmulatedDevice::exchange_capture_mode(CaptureMode mode) { return emulated_exchange_capture_mode(mode); }

void EmulatedDevice::retain_in_capture(DeviceStream& stream, std::shared_ptr<void> keep) {
  enter("cudaGraphRetainUserObject");
  const std::shared_ptr<EmulatedCapture> c = emu(stream).capture();
  if (!c) throw std::invalid_argument("retain_in_capture: the stream is not capturing");
  c->retain(std::move(keep));
}

std::shared_ptr<DeviceGraphExec> EmulatedDevice::instantiate(DeviceGraph& graph) {
  enter("cudaGraphInstantiate");
  return std::make_shared<EmulatedGraphExec>(static_cast<EmulatedGraph&>(graph).body);
}

void EmulatedDevice::launch_graph(DeviceGraphExec& exec, DeviceStream& stream) {
  enter("cudaGraphLaunch", true);
  std::shared_ptr<const EmulatedGraphBody> body = static_cast<EmulatedGraphExec&>(exec).body;
  if (body->ops.empty()) return emu(stream).enqueue([] {});
  if (body->binds_at_launch) {  // this launch's operations of the nodes that read the launch's moment
    auto bound = std::make_shared<EmulatedGraphBody>(*body);
    for (CapturedOp& op : bound->ops)
      if (op.at_launch) op.fn = op.at_launch();
    body = std::move(bound);
  }
  emu(stream).enqueue([body] { run_captured_graph(*body); });
}

}  // namespace commlib
