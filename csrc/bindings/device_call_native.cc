// The device call cache for C++ callers without the GIL (bindings/device_call_cache.h): the torch
// backend's CUDA tensors through core_api.h's device_collective and device_p2p, with nothing of
// Python's touched (the caller holds its tensors until the work is known complete), and the works
// of steady calls reused (bindings/device_work_pool.h, NativeWorkPool).
#include <optional>
#include <utility>
#include <vector>

#include "bindings/device_call_cache.h"

namespace commlib {

bool DeviceCallCache::run_native(const CallKey& k, std::shared_ptr<DeviceWork>* work) {
  DeviceCallCounts::native_offers.fetch_add(1, std::memory_order_relaxed);
  struct Hit {  // copies of what the call needs, never of the entry's Python objects
    std::shared_ptr<StreamEngine> engine;
    PreparedCall call;
    std::shared_ptr<DeviceStream> stream;
  };
  std::optional<Hit> hit;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (entries_.empty() || !valid()) return false;  // (the Python path drops stale entries)
    const auto it = entries_.find(k);
    if (it == entries_.end()) return false;
    hit.emplace(Hit{it->second.engine, it->second.call, it->second.stream});
  }
  // A pooled work nobody owns any more, re-armed for this call (no allocation); else one made and
  // pooled (issue #37, item 2). A call that raises leaves a re-armed one as it was (collective_into).
  if (std::shared_ptr<DeviceWork> reused = native_works_.take()) {
    hit->engine->collective_into(hit->call, *hit->stream, *reused);
    *work = std::move(reused);
  } else {
    *work = hit->engine->collective(hit->call, *hit->stream);
    native_works_.adopt(*work);
  }
  DeviceCallCounts::native_hits.fetch_add(1, std::memory_order_relaxed);
  return true;
}

bool run_device_call_native(DeviceCallCache& cache, const CollectiveCall& call, BufferKind kind_in,
                            BufferKind kind_out, int device, uintptr_t stream, std::shared_ptr<DeviceWork>* work) {
  return cache.run_native(native_key_of(call, kind_in, kind_out, device, stream), work);
}

bool run_device_p2p_native(DeviceCallCache& cache, const P2PItem* items, size_t n, DType dtype, BufferKind kind,
                           int device, uintptr_t stream, std::shared_ptr<DeviceWork>* work) {
  if (!cache.streams().run(DeviceStreamKey{kind, device, stream}, std::vector<P2PItem>(items, items + n), dtype, work))
    return false;
  DeviceCallCounts::native_p2p.fetch_add(1, std::memory_order_relaxed);
  return true;
}

}  // namespace commlib
