// The CUDA device: the device interface (device/device.h) as a thin layer over the CUDA runtime,
// compiled into commlib._C_cuda and handed to the stream engine in commlib._C as a capsule
// (bindings/cuda_module.cc). NEVER RUN: no GPU was lent while it was written; it compiles in CI.
//
//  - memory: cudaMalloc / cudaFree (a free synchronises its stream first: the engine frees only
//    when a buffer grows, so this is off the hot path); IPC: cudaIpcGetMemHandle /
//    cudaIpcOpenMemHandle (several ranks on one GPU included, which NCCL refuses);
//  - counters: the engine's control regions are host memory registered with cudaHostRegister (mapped,
//    portable); write_value / wait_value are the driver's cuStreamWriteValue64 / cuStreamWaitValue64
//    (GEQ), reached through cudaGetDriverEntryPointByVersion, so no libcuda is needed at build time;
//  - kernels: the launchers of kernels/cuda_reduce.h (the bodies the emulated device runs too).
#include "device/cuda_check.h"
#include "device/cuda_device.h"

#include <cuda.h>
#include <cuda_runtime_api.h>

#include <cstdio>
#include <mutex>
#include <stdexcept>
#include <string>

#include "kernels/cuda_codecs.h"
#include "kernels/cuda_plan_kernel.h"
#include "kernels/cuda_reduce.h"

namespace commlib {

namespace {

class CudaStream final : public DeviceStream {
 public:
  CudaStream(cudaStream_t s, bool owned) : stream(s), owned_(owned) {}
  ~CudaStream() override {
    if (owned_) cudaStreamDestroy(stream);
  }
  void* native_handle() override { return stream; }
  cudaStream_t stream;

 private:
  bool owned_;
};

class CudaEvent final : public DeviceEvent {
 public:
  CudaEvent() { cuda_check(cudaEventCreateWithFlags(&event, cudaEventDisableTiming), "cudaEventCreate"); }
  ~CudaEvent() override { cudaEventDestroy(event); }
  void* native_handle() override { return event; }
  cudaEvent_t event;
  bool recorded = false;
};

cudaStream_t cu(DeviceStream& s) { return static_cast<CudaStream&>(s).stream; }

class CudaGraph final : public DeviceGraph {
 public:
  explicit CudaGraph(cudaGraph_t g) : graph(g) {}
  ~CudaGraph() override { cudaGraphDestroy(graph); }
  cudaGraph_t graph;
};

class CudaGraphExec final : public DeviceGraphExec {
 public:
  explicit CudaGraphExec(cudaGraphExec_t e) : exec(e) {}
  ~CudaGraphExec() override { cudaGraphExecDestroy(exec); }  // CUDA defers it past running launches
  cudaGraphExec_t exec;
};

cudaStreamCaptureMode cuda_mode(CaptureMode m) {
  return m == CaptureMode::Global ? cudaStreamCaptureModeGlobal
         : m == CaptureMode::ThreadLocal ? cudaStreamCaptureModeThreadLocal
                                         : cudaStreamCaptureModeRelaxed;
}

CaptureMode our_mode(cudaStreamCaptureMode m) {
  return m == cudaStreamCaptureModeGlobal ? CaptureMode::Global
         : m == cudaStreamCaptureModeThreadLocal ? CaptureMode::ThreadLocal
                                                 : CaptureMode::Relaxed;
}

// A CUDA user object's destructor: drops the graph's reference to what retain_in_capture kept.
void release_kept(void* p) { delete static_cast<std::shared_ptr<void>*>(p); }
CudaEvent& cu(DeviceEvent& e) { return static_cast<CudaEvent&>(e); }

using WriteValue64 = CUresult (*)(CUstream, CUdeviceptr, cuuint64_t, unsigned int);
using WaitValue64 = CUresult (*)(CUstream, CUdeviceptr, cuuint64_t, unsigned int);

void* driver_entry(const char* name) {
  void* fn = nullptr;
  cudaDriverEntryPointQueryResult status{};
  cuda_check(cudaGetDriverEntryPointByVersion(name, &fn, 12000, cudaEnableDefault, &status), name);
  if (!fn || status != cudaDriverEntryPointSuccess)
    throw std::runtime_error(std::string("CUDA driver has no ") + name + " (stream memory operations)");
  return fn;
}

void run_host_function(void* data) {
  auto* fn = static_cast<std::function<void()>*>(data);
  try {
    (*fn)();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "commlib: host function on a CUDA stream failed: %s\n", e.what());
  }
  delete fn;
}

const char kHex[] = "0123456789abcdef";

// The device this thread's innermost guard (a DeviceGuard: the engine's, or a method's own below,
// which nests in it) made current, -1 outside every guard (then torch or CuPy may have set any: the
// first guard asks). So the methods below cost no driver call inside the engine's guard
// (commlib._C's thread-locals are not these); make_current inside a guard updates it.
thread_local int t_guarded = -1;

Device::CurrentToken enter_device(int index) {
  Device::CurrentToken token{index, t_guarded};
  if (t_guarded == index) return token;  // nested in a guard of this device: current already
  cuda_check(cudaGetDevice(&token.previous), "cudaGetDevice");
  if (token.previous != index) cuda_check(cudaSetDevice(index), "cudaSetDevice");
  t_guarded = index;
  return token;
}

// Sets the previous device back where it differs, or where a make_current inside made another current.
// (CUDA's current device is per thread; a library must not leave it changed: torch and CuPy keep
// their own notion of it.)
void leave_device(int index, Device::CurrentToken token) {
  if (token.previous >= 0 && (token.previous != index || t_guarded != index)) cudaSetDevice(token.previous);
  t_guarded = token.enclosing;
}

}  // namespace

CudaDevice::CudaDevice(int index) : index_(index) {
  DeviceGuard current(*this);
  write_value64_ = driver_entry("cuStreamWriteValue64");
  wait_value64_ = driver_entry("cuStreamWaitValue64");
  cuda_preload_kernels();
  cuda_preload_codec_kernels();  // no lazy module load (a context-wide synchronisation) inside a call
}

void CudaDevice::make_current() {
  cuda_check(cudaSetDevice(index_), "cudaSetDevice");
  if (t_guarded >= 0) t_guarded = index_;  // inside a guard: its end sets the previous device back
}

Device::CurrentToken CudaDevice::swap_current() { return enter_device(index_); }

void CudaDevice::restore_current(CurrentToken token) { leave_device(index_, token); }

void* CudaDevice::allocate(size_t bytes) {
  DeviceGuard current(*this);
  void* p = nullptr;
  cuda_check(cudaMalloc(&p, bytes ? bytes : 1), "cudaMalloc");
  return p;
}

void CudaDevice::free_async(void* ptr, DeviceStream& stream) {
  if (!ptr) return;
  DeviceGuard current(*this);
  cuda_check(cudaStreamSynchronize(cu(stream)), "cudaStreamSynchronize");
  cuda_check(cudaFree(ptr), "cudaFree");
}

void* CudaDevice::allocate_ordered(size_t bytes, DeviceStream& stream) {
  DeviceGuard current(*this);
  void* p = nullptr;
  cuda_check(cudaMallocAsync(&p, bytes ? bytes : 1, cu(stream)), "cudaMallocAsync");
  return p;
}

void CudaDevice::free_ordered(void* ptr, DeviceStream& stream) {
  if (!ptr) return;
  DeviceGuard current(*this);
  cuda_check(cudaFreeAsync(ptr, cu(stream)), "cudaFreeAsync");
}

uint64_t* CudaDevice::map_host(void* host, size_t bytes) {
  DeviceGuard current(*this);
  cuda_check(cudaHostRegister(host, bytes, cudaHostRegisterMapped | cudaHostRegisterPortable), "cudaHostRegister");
  void* dev = nullptr;
  cuda_check(cudaHostGetDevicePointer(&dev, host, 0), "cudaHostGetDevicePointer");
  return static_cast<uint64_t*>(dev);
}

void CudaDevice::unmap_host(void* host) { cudaHostUnregister(host); }

std::string CudaDevice::export_memory(void* ptr) {
  DeviceGuard current(*this);
  cudaIpcMemHandle_t h;
  cuda_check(cudaIpcGetMemHandle(&h, ptr), "cudaIpcGetMemHandle");
  std::string out = "cuda:";
  const auto* b = reinterpret_cast<const unsigned char*>(&h);
  for (size_t i = 0; i < sizeof h; ++i) {
    out += kHex[b[i] >> 4];
    out += kHex[b[i] & 15];
  }
  return out;
}

void* CudaDevice::import_memory(const std::string& handle) {
  cudaIpcMemHandle_t h;
  if (handle.size() != 5 + 2 * sizeof h || handle.rfind("cuda:", 0) != 0)
    throw std::invalid_argument("CUDA device: malformed memory handle");
  auto nibble = [&](char c) -> int {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    throw std::invalid_argument("CUDA device: malformed memory handle");
  };
  auto* b = reinterpret_cast<unsigned char*>(&h);
  for (size_t i = 0; i < sizeof h; ++i) b[i] = static_cast<unsigned char>(nibble(handle[5 + 2 * i]) << 4 | nibble(handle[6 + 2 * i]));
  DeviceGuard current(*this);
  void* p = nullptr;
  cuda_check(cudaIpcOpenMemHandle(&p, h, cudaIpcMemLazyEnablePeerAccess), "cudaIpcOpenMemHandle");
  return p;
}

void CudaDevice::close_import(void* ptr) { cudaIpcCloseMemHandle(ptr); }

std::shared_ptr<DeviceStream> CudaDevice::create_stream() {
  DeviceGuard current(*this);
  cudaStream_t s;
  cuda_check(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), "cudaStreamCreate");
  return std::make_shared<CudaStream>(s, true);
}

std::shared_ptr<DeviceStream> CudaDevice::wrap_stream(uintptr_t stream) {
  return std::make_shared<CudaStream>(reinterpret_cast<cudaStream_t>(stream), false);
}

std::shared_ptr<DeviceEvent> CudaDevice::create_event() {
  DeviceGuard current(*this);
  return std::make_shared<CudaEvent>();
}

void CudaDevice::record(DeviceEvent& event, DeviceStream& stream) {
  DeviceGuard current(*this);
  cuda_check(cudaEventRecord(cu(event).event, cu(stream)), "cudaEventRecord");
  cu(event).recorded = true;
}

void CudaDevice::wait_event(DeviceStream& stream, DeviceEvent& event) {
  if (cu(event).recorded) cuda_check(cudaStreamWaitEvent(cu(stream), cu(event).event, 0), "cudaStreamWaitEvent");
}
void CudaDevice::wait_event_external(DeviceStream& stream, DeviceEvent& event) {
  cuda_check(cudaStreamWaitEvent(cu(stream), cu(event).event, cudaEventWaitExternal), "cudaStreamWaitEvent (external)");
}

bool CudaDevice::query(DeviceEvent& event) {
  const cudaError_t err = cudaEventQuery(cu(event).event);
  if (err == cudaErrorNotReady) return false;
  cuda_check(err, "cudaEventQuery");
  return true;
}

void CudaDevice::synchronize(DeviceEvent& event) { cuda_check(cudaEventSynchronize(cu(event).event), "cudaEventSynchronize"); }

void CudaDevice::synchronize(DeviceStream& stream) { cuda_check(cudaStreamSynchronize(cu(stream)), "cudaStreamSynchronize"); }

void CudaDevice::copy(void* dst, const void* src, size_t bytes, DeviceStream& stream) {
  DeviceGuard current(*this);
  if (bytes) cuda_check(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault, cu(stream)), "cudaMemcpyAsync");
}

void CudaDevice::begin_capture(DeviceStream& stream, CaptureMode mode) {
  DeviceGuard current(*this);
  cuda_check(cudaStreamBeginCapture(cu(stream), cuda_mode(mode)), "cudaStreamBeginCapture");
}

std::shared_ptr<DeviceGraph> CudaDevice::end_capture(DeviceStream& stream) {
  DeviceGuard current(*this);
  cudaGraph_t g = nullptr;
  cuda_check(cudaStreamEndCapture(cu(stream), &g), "cudaStreamEndCapture");
  return std::make_shared<CudaGraph>(g);
}

CaptureStatus CudaDevice::capture_status(DeviceStream& stream, uint64_t* id) {
  cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
  unsigned long long capture_id = 0;
  cuda_check(cudaStreamGetCaptureInfo(cu(stream), &status, &capture_id), "cudaStreamGetCaptureInfo");
  if (id) *id = status == cudaStreamCaptureStatusNone ? 0 : capture_id;
  return status == cudaStreamCaptureStatusActive        ? CaptureStatus::Active
         : status == cudaStreamCaptureStatusInvalidated ? CaptureStatus::Invalidated
                                                        : CaptureStatus::None;
}

CaptureMode CudaDevice::exchange_capture_mode(CaptureMode mode) {
  cudaStreamCaptureMode m = cuda_mode(mode);
  cuda_check(cudaThreadExchangeStreamCaptureMode(&m), "cudaThreadExchangeStreamCaptureMode");
  return our_mode(m);
}

void CudaDevice::retain_in_capture(DeviceStream& stream, std::shared_ptr<void> keep) {
  DeviceGuard current(*this);
  cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
  cudaGraph_t g = nullptr;
  cuda_check(cudaStreamGetCaptureInfo(cu(stream), &status, nullptr, &g), "cudaStreamGetCaptureInfo");
  if (status != cudaStreamCaptureStatusActive || !g)
    throw std::invalid_argument("retain_in_capture: the stream is not capturing");
  auto* heap = new std::shared_ptr<void>(std::move(keep));
  cudaUserObject_t obj;
  const cudaError_t err = cudaUserObjectCreate(&obj, heap, release_kept, 1, cudaUserObjectNoDestructorSync);
  if (err != cudaSuccess) delete heap;
  cuda_check(err, "cudaUserObjectCreate");
  cuda_check(cudaGraphRetainUserObject(g, obj, 1, cudaGraphUserObjectMove), "cudaGraphRetainUserObject");
}

std::shared_ptr<DeviceGraphExec> CudaDevice::instantiate(DeviceGraph& graph) {
  DeviceGuard current(*this);
  cudaGraphExec_t exec = nullptr;
  cuda_check(cudaGraphInstantiate(&exec, static_cast<CudaGraph&>(graph).graph, 0), "cudaGraphInstantiate");
  return std::make_shared<CudaGraphExec>(exec);
}

void CudaDevice::launch_graph(DeviceGraphExec& exec, DeviceStream& stream) {
  DeviceGuard current(*this);
  cuda_check(cudaGraphLaunch(static_cast<CudaGraphExec&>(exec).exec, cu(stream)), "cudaGraphLaunch");
}

unsigned CudaDevice::plan_blocks(unsigned wanted) const { return cuda_plan_blocks(wanted); }

void CudaDevice::launch_plan(const kexec::PlanLaunch& launch, unsigned blocks, DType dtype, RedOp op, bool reduces,
                             DeviceStream& stream) {
  DeviceGuard current(*this);
  cuda_launch_plan(launch, blocks, dtype, op, reduces, cu(stream));
}

void CudaDevice::reduce(void* dst, const void* src, size_t n, DType dtype, RedOp op, DeviceStream& stream) {
  DeviceGuard current(*this);
  cuda_reduce_inplace(dst, src, n, dtype, op, cu(stream));
}

void CudaDevice::scale_copy(void* dst, const void* src, size_t n, DType dtype, double scale, DeviceStream& stream) {
  DeviceGuard current(*this);
  cuda_scale_copy(dst, src, n, dtype, scale, cu(stream));
}

void CudaDevice::divide(void* dst, size_t n, DType dtype, int64_t divisor, DeviceStream& stream) {
  DeviceGuard current(*this);
  cuda_divide_inplace(dst, n, dtype, divisor, cu(stream));
}

void CudaDevice::copy_unless(const uint64_t* stop, void* dst, const void* src, size_t bytes, DeviceStream& stream) {
  DeviceGuard current(*this);
  cuda_copy_unless(stop, dst, src, bytes, cu(stream));
}

void CudaDevice::reduce_unless(const uint64_t* stop, void* dst, const void* src, size_t n, DType dtype, RedOp op,
                               DeviceStream& stream) {
  DeviceGuard current(*this);
  cuda_reduce_inplace(dst, src, n, dtype, op, cu(stream), stop);
}

void CudaDevice::divide_unless(const uint64_t* stop, void* dst, size_t n, DType dtype, int64_t divisor,
                               DeviceStream& stream) {
  DeviceGuard current(*this);
  cuda_divide_inplace(dst, n, dtype, divisor, cu(stream), stop);
}

void CudaDevice::codec_encode(const uint64_t* stop, const CodecSpec& spec, DType dtype, const void* src, size_t n,
                              void* dst, uint64_t counter_base, DeviceStream& stream) {
  DeviceGuard current(*this);
  cuda_codec(true, spec, dtype, src, n, dst, counter_base, cu(stream), stop);
}

void CudaDevice::codec_decode(const uint64_t* stop, const CodecSpec& spec, DType dtype, const void* src, size_t n,
                              void* dst, DeviceStream& stream) {
  DeviceGuard current(*this);
  cuda_codec(false, spec, dtype, src, n, dst, 0, cu(stream), stop);
}

void CudaDevice::write_value(uint64_t* addr, uint64_t value, DeviceStream& stream) {
  const CUresult r = reinterpret_cast<WriteValue64>(write_value64_)(
      reinterpret_cast<CUstream>(cu(stream)), reinterpret_cast<CUdeviceptr>(addr), value, CU_STREAM_WRITE_VALUE_DEFAULT);
  if (r != CUDA_SUCCESS) throw std::runtime_error("cuStreamWriteValue64 failed: " + std::to_string(static_cast<int>(r)));
}

void CudaDevice::wait_value(const uint64_t* addr, uint64_t value, DeviceStream& stream) {
  const CUresult r = reinterpret_cast<WaitValue64>(wait_value64_)(
      reinterpret_cast<CUstream>(cu(stream)), reinterpret_cast<CUdeviceptr>(addr), value, CU_STREAM_WAIT_VALUE_GEQ);
  if (r != CUDA_SUCCESS) throw std::runtime_error("cuStreamWaitValue64 failed: " + std::to_string(static_cast<int>(r)));
}

void CudaDevice::host_func(std::function<void()> fn, DeviceStream& stream) {
  auto* heap = new std::function<void()>(std::move(fn));
  const cudaError_t err = cudaLaunchHostFunc(cu(stream), run_host_function, heap);
  if (err != cudaSuccess) delete heap;
  cuda_check(err, "cudaLaunchHostFunc");
}

std::shared_ptr<CudaDevice> cuda_device(int index) {
  static std::mutex mu;
  static auto* devices = new std::map<int, std::shared_ptr<CudaDevice>>();  // for the process's life
  std::lock_guard<std::mutex> lk(mu);
  auto& d = (*devices)[index];
  if (!d) d = std::make_shared<CudaDevice>(index);
  return d;
}

}  // namespace commlib
