// CUDA launcher for the reduction functors of reduce_ops.h: one grid-stride elementwise kernel,
// with 16-byte vector loads when both pointers allow it. All numerics live in reduce_ops.h.
#include "kernels/cuda_reduce.h"

#include <cuda_runtime.h>

#include <algorithm>
#include <stdexcept>
#include <string>

#include "kernels/reduce_ops.h"

namespace commlib {
namespace {

using kern::DTypeTraits;

constexpr int kThreads = 256;
constexpr size_t kMaxBlocks = 8192;  // grid-stride beyond this

enum Access : int { kVector = 0, kElement = 1, kBytes = 2 };

template <typename S>
struct alignas(16) Pack {
  static constexpr int kN = 16 / sizeof(S);
  S v[kN];
};

// Elementwise bodies: out = f(dst_value, src_value) on storage values.
template <DType D, class Op>
struct ReduceElem {
  using Tr = DTypeTraits<D>;
  using S = typename Tr::storage;
  static constexpr bool kReadsDst = true;
  __device__ __forceinline__ S operator()(S a, S b) const { return Tr::store(Op{}(Tr::load(a), Tr::load(b))); }
};

template <DType D>
struct ScaleElem {
  using Tr = DTypeTraits<D>;
  using S = typename Tr::storage;
  static constexpr bool kReadsDst = false;
  kern::Scale<typename Tr::compute> op;
  __device__ __forceinline__ S operator()(S, S b) const { return Tr::store(op(Tr::load(b))); }
};

template <DType D>
struct DivideElem {
  using Tr = DTypeTraits<D>;
  using S = typename Tr::storage;
  static constexpr bool kReadsDst = true;
  kern::Divide<typename Tr::compute> op;
  __device__ __forceinline__ S operator()(S a, S) const { return Tr::store(op(Tr::load(a))); }
};

template <typename S>
__device__ __forceinline__ S load_any(const void* p, size_t i) {
  S x;
  memcpy(&x, static_cast<const unsigned char*>(p) + i * sizeof(S), sizeof(S));
  return x;
}
template <typename S>
__device__ __forceinline__ void store_any(void* p, size_t i, S x) {
  memcpy(static_cast<unsigned char*>(p) + i * sizeof(S), &x, sizeof(S));
}

// dst[i] = f(dst[i], src[i]); src may equal dst (divide passes dst as src).
template <class F, int kAccess>
__global__ void __launch_bounds__(kThreads) elementwise_kernel(void* dst, const void* src, size_t n, F f) {
  using S = typename F::S;
  const size_t tid = static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  const size_t stride = static_cast<size_t>(gridDim.x) * blockDim.x;
  size_t done = 0;
  if constexpr (kAccess == kVector) {
    using P = Pack<S>;
    P* d = static_cast<P*>(dst);
    const P* s = static_cast<const P*>(src);
    const size_t npacks = n / P::kN;
    for (size_t i = tid; i < npacks; i += stride) {
      P a{};
      if constexpr (F::kReadsDst) a = d[i];
      const P b = s[i];
#pragma unroll
      for (int j = 0; j < P::kN; ++j) a.v[j] = f(a.v[j], b.v[j]);
      d[i] = a;
    }
    done = npacks * P::kN;
  }
  if constexpr (kAccess == kBytes) {
    for (size_t i = tid; i < n; i += stride) {
      const S a = F::kReadsDst ? load_any<S>(dst, i) : S{};
      store_any<S>(dst, i, f(a, load_any<S>(src, i)));
    }
  } else {
    S* d = static_cast<S*>(dst);
    const S* s = static_cast<const S*>(src);
    for (size_t i = done + tid; i < n; i += stride) d[i] = f(F::kReadsDst ? d[i] : S{}, s[i]);
  }
}

void check_launch(const char* what) {
  const cudaError_t err = cudaGetLastError();
  if (err != cudaSuccess)
    throw std::runtime_error(std::string(what) + ": kernel launch failed: " + cudaGetErrorName(err) + ": " +
                             cudaGetErrorString(err));
}

template <class F>
void launch(const char* what, void* dst, const void* src, size_t n, F f, cudaStream_t stream) {
  using S = typename F::S;
  if (n == 0) return;
  const uintptr_t bits = reinterpret_cast<uintptr_t>(dst) | reinterpret_cast<uintptr_t>(src);
  const int access = bits % 16 == 0 ? kVector : (bits % sizeof(S) == 0 ? kElement : kBytes);
  const size_t work = access == kVector ? std::max<size_t>(n / Pack<S>::kN, n % Pack<S>::kN) : n;
  const unsigned blocks = static_cast<unsigned>(std::min<size_t>((work + kThreads - 1) / kThreads, kMaxBlocks));
  if (access == kVector)
    elementwise_kernel<F, kVector><<<blocks, kThreads, 0, stream>>>(dst, src, n, f);
  else if (access == kElement)
    elementwise_kernel<F, kElement><<<blocks, kThreads, 0, stream>>>(dst, src, n, f);
  else
    elementwise_kernel<F, kBytes><<<blocks, kThreads, 0, stream>>>(dst, src, n, f);
  check_launch(what);
}

struct ReduceVisitor {
  void* dst;
  const void* src;
  size_t n;
  cudaStream_t stream;
  template <DType D, class Op>
  void reduce() {
    launch("cuda_reduce_inplace", dst, src, n, ReduceElem<D, Op>{}, stream);
  }
};

struct ScaleVisitor {
  void* dst;
  const void* src;
  size_t n;
  double scale;
  cudaStream_t stream;
  template <DType D>
  void typed() {
    launch("cuda_scale_copy", dst, src, n,
           ScaleElem<D>{kern::Scale<typename DTypeTraits<D>::compute>(scale)}, stream);
  }
};

struct DivideVisitor {
  void* dst;
  size_t n;
  int64_t divisor;
  cudaStream_t stream;
  template <DType D>
  void typed() {
    launch("cuda_divide_inplace", dst, dst, n,
           DivideElem<D>{kern::Divide<typename DTypeTraits<D>::compute>(divisor)}, stream);
  }
};

}  // namespace

void cuda_reduce_inplace(void* dst, const void* src, size_t n, DType dtype, RedOp op, cudaStream_t stream) {
  ReduceVisitor v{dst, src, n, stream};
  kern::dispatch_reduce(dtype, op, v);
}

void cuda_scale_copy(void* dst, const void* src, size_t n, DType dtype, double scale, cudaStream_t stream) {
  ScaleVisitor v{dst, src, n, scale, stream};
  kern::dispatch_dtype(dtype, v);
}

void cuda_divide_inplace(void* dst, size_t n, DType dtype, int64_t divisor, cudaStream_t stream) {
  kern::check_divisor(divisor);
  DivideVisitor v{dst, n, divisor, stream};
  kern::dispatch_dtype(dtype, v);
}

}  // namespace commlib
