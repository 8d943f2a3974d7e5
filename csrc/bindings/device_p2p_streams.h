// The device streams a communicator's device route can run calls on from C++, and their engines:
// where the torch backend's CUDA sends and receives run from C++ (core_api.h device_p2p), and its
// collectives of new shapes (device_call_new_shape.cc), with no Python in between. Part of the
// device call cache (bindings/device_call_cache.h), which fills it after each collective it caches,
// and the route after each point-to-point batch on a current stream (DeviceCallCache.add_stream)
// and after each engine it sets up (DeviceCallCache.add_engine).
//
// The engine is set up on the Python path (a rendezvous of every rank through the store: docs/
// torch_backend.md, "What stays on the Python path"). A stream is the engine's as soon as its
// engine is: one the route ran a call on has its wrapper already; any other (a second stream, a
// side stream per bucket, a `torch.cuda.stream(s)` block) is wrapped here on its first call, as the
// route's resolver would wrap it (CudaDevice::wrap_stream, a non-owning wrapper, through
// commlib._C_cuda's function pointer: device_stream_wrapper.h; on the emulated device its live
// stream of that identity, EmulatedDevice::stream_named), and remembered. Neither wrapping makes a
// CUDA call, so a capturing stream is wrapped too and its call meets the engine's capture rules as
// on the Python path (stream_capture.cc). What the route checks of a point-to-point batch beyond
// that (peers, one device, buffer kinds) the C++ caller checks itself (torch tensors on one CUDA
// device, peers in range). Both maps are bounded and emptied when the route aborts or closes.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <unordered_map>
#include <utility>
#include <vector>

#include "bindings/buffer_view.h"
#include "bindings/device_stream_wrapper.h"
#include "plan/call.h"
#include "stream/stream_engine.h"

namespace commlib {

struct DeviceStreamKey {
  BufferKind kind = BufferKind::None;
  int device = -1;
  uintptr_t stream = 0;  // the stream's identity as the cache keys the current stream (cudaStream_t, emulated 0/ptr)
  bool operator==(const DeviceStreamKey& o) const { return kind == o.kind && device == o.device && stream == o.stream; }
};

struct DeviceStreamKeyHash {
  size_t operator()(const DeviceStreamKey& k) const {
    return std::hash<uintptr_t>()(k.stream) ^ (static_cast<size_t>(k.device + 1) * 131 + static_cast<size_t>(k.kind));
  }
};

// Streams this process's caches wrapped in C++ (a stream no call of the route ran on), for tests.
struct DeviceStreamCounts {
  static std::atomic<uint64_t> wrapped;
};

class DeviceP2PStreams {
 public:
  // Wraps a stream of the engine's device by its identity (null: not a stream of that device).
  using Wrap = std::function<std::shared_ptr<DeviceStream>(uintptr_t)>;

  void remember(const DeviceStreamKey& k, std::shared_ptr<StreamEngine> engine, std::shared_ptr<DeviceStream> stream) {
    std::lock_guard<std::mutex> lock(mu_);
    remember_locked(k, std::move(engine), std::move(stream));
  }

  // The route set up `engine` for device `kind`:`device`: calls on any stream of it may run here.
  void add_engine(BufferKind kind, int device, std::shared_ptr<StreamEngine> engine, Wrap wrap) {
    std::lock_guard<std::mutex> lock(mu_);
    engines_[DeviceStreamKey{kind, device, 0}] = {std::move(engine), std::move(wrap)};
  }

  // `stream` was enqueued on as this thread's current stream of `kind`:`device`. False for a kind
  // without a current stream here.
  bool add_current(BufferKind kind, int device, std::shared_ptr<StreamEngine> engine,
                   std::shared_ptr<DeviceStream> stream) {
    DeviceStreamKey k{kind, device, 0};
    if (kind == BufferKind::Emulated)
      k.stream = current_emulated_stream();
    else if (kind != BufferKind::Cuda || !current_cuda_stream(device, &k.stream))
      return false;
    remember(k, std::move(engine), std::move(stream));
    return true;
  }

  // The engine and the engine's stream for the stream `k` names: one seen before, else one of a
  // set-up engine's device wrapped now (and remembered); false when the engine is not set up or
  // the device has no such stream.
  bool find(const DeviceStreamKey& k, std::shared_ptr<StreamEngine>* engine, std::shared_ptr<DeviceStream>* stream) {
    std::lock_guard<std::mutex> lock(mu_);
    const auto it = streams_.find(k);
    if (it != streams_.end()) {
      *engine = it->second.first;
      *stream = it->second.second;
      return true;
    }
    const auto e = engines_.find(DeviceStreamKey{k.kind, k.device, 0});
    if (e == engines_.end() || !e->second.second) return false;
    std::shared_ptr<DeviceStream> wrapped = e->second.second(k.stream);
    if (!wrapped) return false;
    *engine = e->second.first;
    *stream = wrapped;
    remember_locked(k, e->second.first, std::move(wrapped));
    DeviceStreamCounts::wrapped.fetch_add(1, std::memory_order_relaxed);
    return true;
  }

  // Enqueues `items` on the stream `k` names (true, *work its handle); false when none is known
  // (nothing ran). Throws what the engine throws. Without the GIL. `a2av_count` >= 0: an all_to_all
  // with split sizes, numbered as a collective (StreamEngine::all_to_allv).
  bool run(const DeviceStreamKey& k, const std::vector<P2PItem>& items, DType dtype, std::shared_ptr<DeviceWork>* work,
           int64_t a2av_count = -1) {
    std::shared_ptr<StreamEngine> engine;
    std::shared_ptr<DeviceStream> stream;
    if (!find(k, &engine, &stream)) return false;
    *work = a2av_count >= 0 ? engine->all_to_allv(items, dtype, a2av_count, *stream) : engine->p2p(items, dtype, *stream);
    return true;
  }

  // The route aborted or closed its engines.
  void clear() {
    std::lock_guard<std::mutex> lock(mu_);
    streams_.clear();
    engines_.clear();
  }

 private:
  void remember_locked(const DeviceStreamKey& k, std::shared_ptr<StreamEngine> engine,
                       std::shared_ptr<DeviceStream> stream) {
    if (streams_.size() >= kMaxStreams) streams_.clear();  // (wrapped again on their next call)
    streams_[k] = {std::move(engine), std::move(stream)};
  }

  static constexpr size_t kMaxStreams = 256;
  std::mutex mu_;
  std::unordered_map<DeviceStreamKey, std::pair<std::shared_ptr<StreamEngine>, std::shared_ptr<DeviceStream>>,
                     DeviceStreamKeyHash>
      streams_;
  // (kind, device, 0) -> the engine the route set up there and how its device wraps a stream.
  std::unordered_map<DeviceStreamKey, std::pair<std::shared_ptr<StreamEngine>, Wrap>, DeviceStreamKeyHash> engines_;
};

}  // namespace commlib
