// How commlib._C wraps a CUDA stream it has not seen as the engine's DeviceStream without Python
// (bindings/device_p2p_streams.h): commlib._C_cuda, which alone links the CUDA runtime, hands the
// device route one function pointer in a capsule of this name (cuda_module.cc, `stream_wrapper`),
// which the route gives the call cache when it sets a CUDA engine up (DeviceCallCache.add_engine).
// The function is CudaDevice::wrap_stream: a non-owning wrapper, no CUDA call.
#pragma once

#include <cstdint>
#include <memory>

namespace commlib {

class DeviceStream;

// (device index, cudaStream_t as an integer; 0: the legacy default stream) -> the wrapper.
using CudaStreamWrapper = std::shared_ptr<DeviceStream> (*)(int index, uintptr_t stream);
constexpr const char* kCudaStreamWrapperCapsule = "commlib.CudaStreamWrapper";

}  // namespace commlib
