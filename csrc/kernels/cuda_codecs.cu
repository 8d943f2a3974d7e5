// CUDA launcher of the codecs' kernel bodies (codec_kernel.h, which the emulated device also runs
// on the host): an encode with scales is its scales kernel then its codes kernel on one stream.
#include "kernels/cuda_codecs.h"

#include <cuda_runtime.h>

#include <stdexcept>
#include <string>

#include "kernels/codec_kernel.h"

namespace commlib {
namespace {

using namespace gpu;

enum CodecPass : int { kScales = 0, kCodes = 1, kBf16Encode = 2, kDecode = 3 };

// `stop` as in cuda_reduce.cu: one read per block; nonzero: the block writes nothing.
template <class G, DType D, int kPass>
__global__ void __launch_bounds__(kCodecThreads) codec_kernel(CodecArgs a, const uint64_t* stop) {
  if (stop) {
    __shared__ int skip;
    if (threadIdx.x == 0) skip = *reinterpret_cast<const volatile uint64_t*>(stop) != 0;
    __syncthreads();
    if (skip) return;
  }
  if constexpr (kPass == kDecode) {
    codec_decode_body<G, D>(a);
  } else if constexpr (std::is_void<G>::value) {
    bf16_encode_body<D>(a);
  } else if constexpr (kPass == kScales) {
    codec_scales_body<G, D>(a);
  } else {
    codec_codes_body<G, D>(a);
  }
}

void check_launch() {
  const cudaError_t err = cudaGetLastError();
  if (err != cudaSuccess)
    throw std::runtime_error(std::string("cuda_codec: kernel launch failed: ") + cudaGetErrorName(err) + ": " +
                             cudaGetErrorString(err));
}

struct CudaCodecLaunch {
  CodecArgs a;
  bool encode;
  cudaStream_t stream;
  const uint64_t* stop;
  bool preload = false;
  template <class G, DType D, int kPass>
  void one(size_t work) {
    if (preload) {
      cudaFuncAttributes attr;
      cudaFuncGetAttributes(&attr, codec_kernel<G, D, kPass>);
      return;
    }
    codec_kernel<G, D, kPass><<<codec_grid(work), kCodecThreads, 0, stream>>>(a, stop);
    check_launch();
  }
  template <class G, DType D>
  void run() {
    if (a.n == 0 && !preload) return;
    if (!encode) return one<G, D, kDecode>(a.n);
    if constexpr (std::is_void<G>::value) {
      one<G, D, kBf16Encode>(a.n);
    } else {
      one<G, D, kScales>((a.n + a.block - 1) / a.block);
      one<G, D, kCodes>(std::is_same<G, kern::Int4Grid>::value ? (a.n + 1) / 2 : a.n);
    }
  }
};

}  // namespace

void cuda_codec(bool encode, const CodecSpec& spec, DType dtype, const void* src, size_t n, void* dst,
                uint64_t counter_base, cudaStream_t stream, const uint64_t* stop) {
  check_codec(spec, dtype);
  CudaCodecLaunch launch{codec_args(spec, src, n, dst, counter_base), encode, stream, stop};
  dispatch_codec(spec.kind, dtype, launch);
}

void cuda_preload_codec_kernels() {
  const kern::CodecKind kinds[] = {kern::CodecKind::BF16, kern::CodecKind::FP8E4M3, kern::CodecKind::FP8E5M2,
                                   kern::CodecKind::Int8, kern::CodecKind::Int4};
  const DType dtypes[] = {DType::Float32, DType::Float16, DType::BFloat16};
  for (const kern::CodecKind kind : kinds)
    for (const DType dtype : dtypes)
      for (const bool encode : {true, false}) {
        CudaCodecLaunch launch{CodecArgs{}, encode, nullptr, nullptr, true};
        dispatch_codec(kind, dtype, launch);
      }
  cudaGetLastError();
}

}  // namespace commlib
