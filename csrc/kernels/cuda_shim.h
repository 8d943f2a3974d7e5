// Lets a CUDA kernel body compile as host C++ so the emulated device can run the GPU's own code.
//
// Under nvcc this header is empty. Elsewhere the CUDA qualifiers become plain inline C++ and
// threadIdx / blockIdx / blockDim / gridDim become thread-local variables that a host "launch"
// (emu_launch below) sets before calling the body once per (block, thread): the same grid, the
// same index arithmetic, the same grid-stride loops as on the GPU, executed one thread at a time.
#pragma once

#ifdef __CUDACC__
#define COMMLIB_UNROLL _Pragma("unroll")
#else
#define COMMLIB_UNROLL _Pragma("GCC unroll 16")
#endif

#ifndef __CUDACC__

#include <cstdint>

#define __global__
#define __device__
#define __host__
#define __forceinline__ inline __attribute__((always_inline))
#define __launch_bounds__(...)

namespace commlib {

struct EmuDim3 {
  unsigned x = 0, y = 0, z = 0;
};

// Set by emu_launch for the body it is running (one host thread executes one launch at a time).
extern thread_local EmuDim3 threadIdx, blockIdx, blockDim, gridDim;

// Runs body() once for every (block, thread) of a 1-D grid, in block-major order.
template <class Body>
void emu_launch(unsigned blocks, unsigned threads, Body&& body) {
  gridDim = EmuDim3{blocks, 1, 1};
  blockDim = EmuDim3{threads, 1, 1};
  for (unsigned b = 0; b < blocks; ++b) {
    blockIdx = EmuDim3{b, 0, 0};
    for (unsigned t = 0; t < threads; ++t) {
      threadIdx = EmuDim3{t, 0, 0};
      body();
    }
  }
}

}  // namespace commlib

#endif  // __CUDACC__
