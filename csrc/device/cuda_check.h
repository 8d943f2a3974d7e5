// The CUDA layer's one check of a runtime call's status (cuda_device.cc, cuda_device_ranges.cc).
#pragma once

#include <cuda_runtime_api.h>

#include <stdexcept>
#include <string>

namespace commlib {

// A failure clears CUDA's last error (so the next call does not report it again) and throws naming
// the call and CUDA's error.
inline void cuda_check(cudaError_t err, const char* what) {
  if (err != cudaSuccess) {
    cudaGetLastError();
    throw std::runtime_error(std::string(what) + ": " + cudaGetErrorName(err) + ": " + cudaGetErrorString(err));
  }
}

}  // namespace commlib
