// The device streams a communicator's device route has enqueued calls on as some thread's current
// stream, and their engines: where the torch backend's CUDA sends and receives run from C++
// (core_api.h device_p2p), and its collectives of new shapes (device_call_new_shape.cc), with no
// Python in between. Part of the device call cache
// (bindings/device_call_cache.h), which fills it after each collective it caches, and the route
// after each point-to-point batch on a current stream (DeviceCallCache.add_stream).
//
// Why only streams the route has used: the engine is set up (a rendezvous of every rank) and a
// cudaStream_t is wrapped as the engine's DeviceStream (by commlib._C_cuda) on the Python path; a
// stream it has run a call on has both, and the call's buffers passed its checks. What the route
// checks of a point-to-point batch beyond that (peers, one device, buffer kinds) the C++ caller
// checks itself (torch tensors on one CUDA device, peers in range).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <unordered_map>
#include <utility>
#include <vector>

#include "bindings/buffer_view.h"
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

class DeviceP2PStreams {
 public:
  void remember(const DeviceStreamKey& k, std::shared_ptr<StreamEngine> engine, std::shared_ptr<DeviceStream> stream) {
    std::lock_guard<std::mutex> lock(mu_);
    if (streams_.size() >= kMaxStreams) streams_.clear();
    streams_[k] = {std::move(engine), std::move(stream)};
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

  // The engine and the engine's stream for the stream `k` names; false when none is known.
  bool find(const DeviceStreamKey& k, std::shared_ptr<StreamEngine>* engine, std::shared_ptr<DeviceStream>* stream) {
    std::lock_guard<std::mutex> lock(mu_);
    const auto it = streams_.find(k);
    if (it == streams_.end()) return false;
    *engine = it->second.first;
    *stream = it->second.second;
    return true;
  }

  // Enqueues `items` on the stream `k` names (true, *work its handle); false when none is known
  // (nothing ran). Throws what the engine throws. Without the GIL.
  bool run(const DeviceStreamKey& k, const std::vector<P2PItem>& items, DType dtype, std::shared_ptr<DeviceWork>* work) {
    std::shared_ptr<StreamEngine> engine;
    std::shared_ptr<DeviceStream> stream;
    {
      std::lock_guard<std::mutex> lock(mu_);
      const auto it = streams_.find(k);
      if (it == streams_.end()) return false;
      engine = it->second.first;
      stream = it->second.second;
    }
    *work = engine->p2p(items, dtype, *stream);
    return true;
  }

  // The route aborted or closed its engines.
  void clear() {
    std::lock_guard<std::mutex> lock(mu_);
    streams_.clear();
  }

 private:
  static constexpr size_t kMaxStreams = 256;
  std::mutex mu_;
  std::unordered_map<DeviceStreamKey, std::pair<std::shared_ptr<StreamEngine>, std::shared_ptr<DeviceStream>>,
                     DeviceStreamKeyHash>
      streams_;
};

}  // namespace commlib
