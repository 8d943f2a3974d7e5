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
  std::optional<NativeEntry> hit;  // copies of what the call needs, never of an entry's Python objects
  {
    std::lock_guard<std::mutex> lock(mu_);
    // (stale entries_ are the Python path's to drop; new_shapes_ are dropped by run_new_shape)
    const auto it = entries_.empty() || !valid() ? entries_.end() : entries_.find(k);
    if (it != entries_.end()) {
      hit.emplace(NativeEntry{it->second.engine, it->second.call, it->second.stream});
    } else if (new_tuning_ == tuning_generation() && new_registry_ == registry_generation()) {
      const auto mine = new_shapes_.find(k);
      if (mine != new_shapes_.end()) hit.emplace(mine->second);
    }
  }
  if (!hit) return run_new_shape(k, work);  // a shape the Python path never ran
  enqueue_native(*hit->engine, hit->call, *hit->stream, work);
  DeviceCallCounts::native_hits.fetch_add(1, std::memory_order_relaxed);
  return true;
}

void DeviceCallCache::enqueue_native(StreamEngine& engine, const PreparedCall& call, DeviceStream& stream,
                                     std::shared_ptr<DeviceWork>* work) {
  // A pooled work nobody owns any more, re-armed for this call (no allocation); else one made and
  // pooled (issue #37, item 2). A call that raises leaves a re-armed one as it was (collective_into).
  if (std::shared_ptr<DeviceWork> reused = native_works_.take()) {
    engine.collective_into(call, stream, *reused);
    *work = std::move(reused);
  } else {
    *work = engine.collective(call, stream);
    native_works_.adopt(*work);
  }
}

bool run_device_call_native(DeviceCallCache& cache, const CollectiveCall& call, BufferKind kind_in,
                            BufferKind kind_out, int device, uintptr_t stream, std::shared_ptr<DeviceWork>* work) {
  return cache.run_native(native_key_of(call, kind_in, kind_out, device, stream), work);
}

bool run_device_p2p_native(DeviceCallCache& cache, const P2PItem* items, size_t n, DType dtype, BufferKind kind,
                           int device, uintptr_t stream, std::shared_ptr<DeviceWork>* work, int64_t a2av_count) {
  if (!cache.streams().run(DeviceStreamKey{kind, device, stream}, std::vector<P2PItem>(items, items + n), dtype, work,
                           a2av_count))
    return false;
  DeviceCallCounts::native_p2p.fetch_add(1, std::memory_order_relaxed);
  return true;
}

}  // namespace commlib
