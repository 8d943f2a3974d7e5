// The emulated device's kernels: the CUDA elementwise kernel body (kernels/elementwise_kernel.h)
// executed on the host through kernels/cuda_shim.h, with the grid the CUDA launcher would use.
#include "device/emulated/emulated_device.h"
#include "device/host_flags.h"
#include "kernels/codec_kernel.h"
#include "kernels/elementwise_kernel.h"

namespace commlib {

thread_local EmuDim3 threadIdx, blockIdx, blockDim, gridDim;

namespace {

using namespace gpu;

// Builds the launch for functor F; dispatching happens when the operation is enqueued (so bad
// arguments throw to the caller), the launch itself when the stream reaches it.
struct EmuLaunch {
  void* dst;
  const void* src;
  size_t n;
  std::function<void()> out;
  template <class F>
  void operator()(F f) {
    if (n == 0) {
      out = [] {};
      return;
    }
    const LaunchShape shape = launch_shape<typename F::S>(dst, src, n);
    void* d = dst;
    const void* s = src;
    const size_t count = n;
    out = [shape, d, s, count, f] {
      if (shape.access == kVector)
        emu_launch(shape.blocks, kThreads, [&] { elementwise_body<F, kVector>(d, s, count, f); });
      else if (shape.access == kElement)
        emu_launch(shape.blocks, kThreads, [&] { elementwise_body<F, kElement>(d, s, count, f); });
      else
        emu_launch(shape.blocks, kThreads, [&] { elementwise_body<F, kBytes>(d, s, count, f); });
    };
  }
};

// A codec's launch(es) for grid G (void: bf16) and dtype D, as cuda_codecs.cu makes them.
struct EmuCodecLaunch {
  CodecArgs args;
  bool encode;
  std::function<void()> out;
  template <class G, DType D>
  void run() {
    const CodecArgs a = args;
    if (a.n == 0) {
      out = [] {};
    } else if (!encode) {
      out = [a] { emu_launch(codec_grid(a.n), kCodecThreads, [&] { codec_decode_body<G, D>(a); }); };
    } else if constexpr (std::is_void<G>::value) {
      out = [a] { emu_launch(codec_grid(a.n), kCodecThreads, [&] { bf16_encode_body<D>(a); }); };
    } else {
      out = [a] {
        emu_launch(codec_grid((a.n + a.block - 1) / a.block), kCodecThreads, [&] { codec_scales_body<G, D>(a); });
        const size_t bytes = std::is_same<G, kern::Int4Grid>::value ? (a.n + 1) / 2 : a.n;
        emu_launch(codec_grid(bytes), kCodecThreads, [&] { codec_codes_body<G, D>(a); });
      };
    }
  }
};

}  // namespace

std::function<void()> emulated_codec_kernel(bool encode, const CodecSpec& spec, DType dtype, const void* src, size_t n,
                                            void* dst, uint64_t counter_base) {
  check_codec(spec, dtype);
  EmuCodecLaunch launch{codec_args(spec, src, n, dst, counter_base), encode, {}};
  dispatch_codec(spec.kind, dtype, launch);
  return std::move(launch.out);
}

std::function<void()> emulated_reduce_kernel(void* dst, const void* src, size_t n, DType dtype, RedOp op) {
  EmuLaunch launch{dst, src, n, {}};
  ReduceVisitor<EmuLaunch> v{launch};
  kern::dispatch_reduce(dtype, op, v);
  return std::move(launch.out);
}

std::function<void()> emulated_scale_kernel(void* dst, const void* src, size_t n, DType dtype, double scale) {
  EmuLaunch launch{dst, src, n, {}};
  ScaleVisitor<EmuLaunch> v{launch, scale};
  kern::dispatch_dtype(dtype, v);
  return std::move(launch.out);
}

std::function<void()> emulated_divide_kernel(void* dst, size_t n, DType dtype, int64_t divisor) {
  kern::check_divisor(divisor);
  EmuLaunch launch{dst, dst, n, {}};
  DivideVisitor<EmuLaunch> v{launch, divisor};
  kern::dispatch_dtype(dtype, v);
  return std::move(launch.out);
}

// A codec launch checks its arguments before the launch is counted; skipped, as the gated
// operations are, when *stop (null: not gated) is nonzero as the stream reaches it.
void EmulatedDevice::codec_encode(const uint64_t* stop, const CodecSpec& spec, DType dtype, const void* src, size_t n,
                                  void* dst, uint64_t counter_base, DeviceStream& stream) {
  auto kernel = emulated_codec_kernel(true, spec, dtype, src, n, dst, counter_base);
  enter(stop ? "a gated codec kernel launch" : "a codec kernel launch", true);
  static_cast<EmulatedStream&>(stream).enqueue_data([stop, kernel = std::move(kernel)] {
    if (!(stop && load_flag(stop))) kernel();
  });
}

void EmulatedDevice::codec_decode(const uint64_t* stop, const CodecSpec& spec, DType dtype, const void* src, size_t n,
                                  void* dst, DeviceStream& stream) {
  auto kernel = emulated_codec_kernel(false, spec, dtype, src, n, dst, 0);
  enter(stop ? "a gated codec kernel launch" : "a codec kernel launch", true);
  static_cast<EmulatedStream&>(stream).enqueue_data([stop, kernel = std::move(kernel)] {
    if (!(stop && load_flag(stop))) kernel();
  });
}

}  // namespace commlib
