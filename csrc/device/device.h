// The device interface: where buffers live and how work on them is ordered. The stream engine
// (stream/stream_engine.h) is written against this and nothing else, so the same engine runs on a
// CUDA GPU (device/cuda_device.cc, a thin layer over the CUDA runtime) and on the emulated device
// (device/emulated/emulated_device.h: host memory, a thread per stream) that CI runs.
//
// Semantics are CUDA's: every operation taking a stream is enqueued and returns at once; a
// stream executes its operations one after another; an event recorded on a stream completes
// when the stream reaches it; wait_event makes a stream wait for the event's latest record as of
// the call. write_value / wait_value are CUDA's stream memory operations (cuStreamWriteValue64 /
// cuStreamWaitValue64 with GEQ) on 64-bit words of host-shared memory mapped with map_host: the
// engine orders ranks with them (a rank's stream waits until a peer's counter reaches a value).
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <stdexcept>
#include <string>

#include "common/types.h"

namespace commlib {

namespace kexec {
struct PlanLaunch;  // kernels/plan_kernel.cuh
}
struct NcclApi;     // device/nccl_loader.h
struct CodecSpec;  // kernels/codec_spec.h

class DeviceStream {
 public:
  virtual ~DeviceStream() = default;
  // The stream as NCCL's API takes it (stream/nccl_link.h): the cudaStream_t on CUDA; on the
  // emulated device (whose NCCL is device/emulated/nccl_emulated.h) the stream object itself.
  virtual void* native_handle() { return this; }
};

class DeviceEvent {
 public:
  virtual ~DeviceEvent() = default;
  // The event as other libraries take it: the cudaEvent_t on CUDA; on the emulated device the
  // event object itself (an identity).
  virtual void* native_handle() { return this; }
};

// -- stream capture and graphs (CUDA's cudaStreamBeginCapture .. cudaGraphLaunch) ----------------
// How a capture interacts with "potentially unsafe" calls (cudaStreamCaptureMode; the rules are
// cudaThreadExchangeStreamCaptureMode's, docs/gpu.md "Stream capture"): a thread whose own mode is
// Global may make no unsafe call (synchronize, event query, cudaMalloc, synchronous copies ...)
// while it has a non-Relaxed capture of its own or any thread has a Global one; ThreadLocal looks
// at its own captures only; Relaxed never prohibits. An unsafe call that is prohibited fails with
// cudaErrorStreamCaptureUnsupported and invalidates the capture(s) that prohibited it.
enum class CaptureMode : uint8_t { Global = 0, ThreadLocal = 1, Relaxed = 2 };
enum class CaptureStatus : uint8_t { None = 0, Active = 1, Invalidated = 2 };
// A captured graph (cudaGraph_t): what end_capture returns; destroyed with the last reference.
class DeviceGraph {
 public:
  virtual ~DeviceGraph() = default;
};
// An instantiated graph (cudaGraphExec_t), launchable any number of times; it keeps what its graph
// retained (retain_in_capture) alive for its own life, as CUDA user objects do.
class DeviceGraphExec {
 public:
  virtual ~DeviceGraphExec() = default;
};

class Device {
 public:
  virtual ~Device() = default;

  virtual std::string name() const = 0;  // "emulated:0", "cuda:1"
  // The NCCL this device provides (device/nccl_loader.h's table), or null: load libnccl
  // (stream/nccl_link.h). The emulated device provides the emulated NCCL.
  virtual const NcclApi* nccl_api() const { return nullptr; }
  // Makes this device the calling thread's current one (cudaSetDevice), as libraries that bind
  // to the current device need (ncclCommInitRank).
  virtual void make_current() {}
  // make_current() for a scope (DeviceGuard), returning what restore_current needs to undo it:
  // the thread's previous current device (-1: none) and the device the enclosing guard made
  // current (-1: none). CUDA's current device is per thread, and a library must leave it as it
  // found it. A guard nested in a guard of the same device makes no driver call (the device is
  // current already, unless a make_current of another device inside the outer guard changed it:
  // then the nested guard sets it again and the outer one's end sets the previous device back).
  struct CurrentToken {
    int previous = -1;
    int enclosing = -1;
  };
  virtual CurrentToken swap_current() {
    make_current();
    return CurrentToken{};
  }
  virtual void restore_current(CurrentToken token) { (void)token; }

  // -- memory ------------------------------------------------------------------------------
  virtual void* allocate(size_t bytes) = 0;
  // Frees memory from allocate() as cudaFree does: once `stream` has executed everything
  // enqueued so far, and, like cudaFree, only after the whole device is idle (every stream of
  // it), so the host waits meanwhile. Never call it while a stream may be parked in a wait for a
  // peer (inside an enqueue): use allocate_ordered / free_ordered there.
  virtual void free_async(void* ptr, DeviceStream& stream) = 0;
  // Stream-ordered memory (cudaMallocAsync / cudaFreeAsync): usable by work enqueued on
  // `stream` after the call; freed once `stream` executed everything enqueued before the free;
  // neither call waits for the device. Not exportable to peers (export_memory needs allocate()).
  virtual void* allocate_ordered(size_t bytes, DeviceStream& stream) = 0;
  virtual void free_ordered(void* ptr, DeviceStream& stream) = 0;
  // The device-side address of host memory shared between processes (a mapped memfd), so that
  // streams can write_value / wait_value on it; unmap_host undoes it.
  virtual uint64_t* map_host(void* host, size_t bytes) = 0;
  virtual void unmap_host(void* host) = 0;

  // The allocation `ptr` lies in (cuPointerGetAttributes: RANGE_START_ADDR, RANGE_SIZE, BUFFER_ID,
  // IS_LEGACY_CUDA_IPC_CAPABLE). `buffer_id` is unique per allocation for the life of the process,
  // so memory freed and allocated again at the same address has another id (and another handle);
  // `shareable`: export_memory(base) works (cudaMalloc'd; not VMM memory without a shareable
  // handle, not a cudaMallocAsync pool's). bytes == 0: not memory of this device.
  struct MemoryRange {
    char* base = nullptr;
    size_t bytes = 0;
    uint64_t buffer_id = 0;
    bool shareable = false;
  };
  virtual MemoryRange memory_range(const void* ptr) {
    (void)ptr;
    return MemoryRange{};
  }

  // -- memory of peer processes (IPC) ----------------------------------------------------------
  // An opaque handle to the allocation starting at `ptr`, valid while it is allocated.
  virtual std::string export_memory(void* ptr) = 0;
  virtual void* import_memory(const std::string& handle) = 0;
  virtual void close_import(void* ptr) = 0;
  // The bytes of the peer's allocation an import_memory answer maps, as this process's driver sees
  // it (cuPointerGetAttributes' RANGE_SIZE); 0: unknown. What the peer's table says is only a claim.
  virtual size_t imported_bytes(void* ptr) {
    (void)ptr;
    return 0;
  }

  // -- streams and events ----------------------------------------------------------------------
  virtual std::shared_ptr<DeviceStream> create_stream() = 0;
  virtual std::shared_ptr<DeviceEvent> create_event() = 0;
  virtual void record(DeviceEvent& event, DeviceStream& stream) = 0;
  virtual void wait_event(DeviceStream& stream, DeviceEvent& event) = 0;
  // cudaStreamWaitEvent with cudaEventWaitExternal, valid only on a capturing stream: the capture
  // records an external event wait node, which waits, at each launch of the graph, for the event's
  // most recent record as of that launch. A capturing stream may wait on an event recorded outside
  // its capture only this way (a plain wait_event fails with cudaErrorStreamCaptureIsolation).
  virtual void wait_event_external(DeviceStream& stream, DeviceEvent& event) = 0;
  virtual bool query(DeviceEvent& event) = 0;            // completed (never recorded: true)
  virtual void synchronize(DeviceEvent& event) = 0;      // host waits for it
  virtual void synchronize(DeviceStream& stream) = 0;    // host waits for everything enqueued

  // -- stream operations (asynchronous) ----------------------------------------------------------
  // Byte copies; either side may be device memory, imported peer memory or host memory.
  virtual void copy(void* dst, const void* src, size_t bytes, DeviceStream& stream) = 0;
  // dst[i] = dst[i] (op) src[i] with the shared functors (kernels/reduce_ops.h); Avg and
  // PremulSum reduce as Sum.
  virtual void reduce(void* dst, const void* src, size_t n, DType dtype, RedOp op, DeviceStream& stream) = 0;
  virtual void scale_copy(void* dst, const void* src, size_t n, DType dtype, double scale, DeviceStream& stream) = 0;
  virtual void divide(void* dst, size_t n, DType dtype, int64_t divisor, DeviceStream& stream) = 0;
  // The copy path's data operations (stream/copy_path.h): copy, reduce and divide as above, except
  // that the stream skips one (writes nothing) when the word `stop` (from map_host) is nonzero as it
  // reaches it. A call whose descriptor check failed, or an engine that failed, sets it, so what
  // the peers sent never lands in an output (stream memory operations cannot be skipped: these
  // are kernels on CUDA). A null `stop`: the same kernel, not gated (COMMLIB_DEVICE_COPY_RECV=ungated).
  virtual void copy_unless(const uint64_t* stop, void* dst, const void* src, size_t bytes, DeviceStream& stream) = 0;
  virtual void reduce_unless(const uint64_t* stop, void* dst, const void* src, size_t n, DType dtype, RedOp op,
                             DeviceStream& stream) = 0;
  virtual void divide_unless(const uint64_t* stop, void* dst, size_t n, DType dtype, int64_t divisor,
                             DeviceStream& stream) = 0;
  // The codecs of compress= on device memory (kernels/codec_kernel.h: the functors of codecs.h,
  // bit for bit the CPU codecs' bytes and values): dst = encode(src[0, n)) into
  // codec_encoded_bytes(spec, n) bytes, counter_base numbering src's first element for stochastic
  // rounding; decode: dst[0, n) = decode(src). Skipped (nothing written) when `stop` (null: not
  // gated) is nonzero as the stream reaches them, like the copy path's data operations. A spec or
  // dtype no codec takes throws std::invalid_argument naming the argument, at the call.
  virtual void codec_encode(const uint64_t* stop, const CodecSpec& spec, DType dtype, const void* src, size_t n,
                            void* dst, uint64_t counter_base, DeviceStream& stream) {
    (void)stop, (void)spec, (void)dtype, (void)src, (void)n, (void)dst, (void)counter_base, (void)stream;
    throw std::runtime_error(name() + ": no codecs on this device");
  }
  virtual void codec_decode(const uint64_t* stop, const CodecSpec& spec, DType dtype, const void* src, size_t n,
                            void* dst, DeviceStream& stream) {
    (void)stop, (void)spec, (void)dtype, (void)src, (void)n, (void)dst, (void)stream;
    throw std::runtime_error(name() + ": no codecs on this device");
  }
  // *addr = value; and: block the stream until *addr >= value. addr comes from map_host.
  virtual void write_value(uint64_t* addr, uint64_t value, DeviceStream& stream) = 0;
  virtual void wait_value(const uint64_t* addr, uint64_t value, DeviceStream& stream) = 0;
  // Runs fn on a host thread when the stream reaches it; the stream waits for fn to return.
  // fn must not call into the device.
  virtual void host_func(std::function<void()> fn, DeviceStream& stream) = 0;

  // -- stream capture and graphs (see CaptureMode above) ---------------------------------------
  // cudaStreamBeginCapture: work enqueued on `stream` from now on (and on streams that join the
  // capture by waiting on an event recorded in it) is recorded into a graph, not run.
  virtual void begin_capture(DeviceStream& stream, CaptureMode mode) {
    (void)stream, (void)mode;
    throw std::runtime_error(name() + ": no stream capture on this device");
  }
  // cudaStreamEndCapture on the stream that began it (the same thread unless Relaxed): the graph,
  // or a std::runtime_error naming cudaErrorStreamCaptureInvalidated (the capture was invalidated)
  // or cudaErrorStreamCaptureUnjoined (a forked stream was not joined back); the capture ends
  // either way.
  virtual std::shared_ptr<DeviceGraph> end_capture(DeviceStream& stream) {
    (void)stream;
    throw std::runtime_error(name() + ": no stream capture on this device");
  }
  // cudaStreamGetCaptureInfo: the stream's capture status and, when capturing, the capture's id
  // (unique in the process).
  virtual CaptureStatus capture_status(DeviceStream& stream, uint64_t* id = nullptr) {
    (void)stream;
    if (id) *id = 0;
    return CaptureStatus::None;
  }
  // cudaThreadExchangeStreamCaptureMode: sets the calling thread's mode, returns the previous one.
  virtual CaptureMode exchange_capture_mode(CaptureMode mode) { return mode; }
  // Keeps `keep` alive as long as the graph being captured on `stream` and every instantiation of
  // it (cudaUserObjectCreate + cudaGraphRetainUserObject): what a captured launch reads must not
  // be freed from under a replay.
  virtual void retain_in_capture(DeviceStream& stream, std::shared_ptr<void> keep) {
    (void)stream, (void)keep;
    throw std::runtime_error(name() + ": no stream capture on this device");
  }
  // cudaGraphInstantiate; the executable graph is destroyed (cudaGraphExecDestroy) with its last
  // reference, which may go while a launch of it still runs (CUDA defers the destruction).
  virtual std::shared_ptr<DeviceGraphExec> instantiate(DeviceGraph& graph) {
    (void)graph;
    throw std::runtime_error(name() + ": no graphs on this device");
  }
  // cudaGraphLaunch: enqueues one run of the whole graph on `stream`, with the values captured.
  virtual void launch_graph(DeviceGraphExec& exec, DeviceStream& stream) {
    (void)exec, (void)stream;
    throw std::runtime_error(name() + ": no graphs on this device");
  }

  // -- the kernel path (stream/kernel_path.h) ----------------------------------------------------
  // Set-up copies from host memory that the host waits for (zeroed flags, plans, peer tables):
  // not a data operation of any call, so the emulated device copies at once (no
  // COMMLIB_EMULATED_DELAY_US), and `src` may be reused when it returns.
  virtual void upload_now(void* dst, const void* src, size_t bytes) {
    auto s = create_stream();
    copy(dst, src, bytes, *s);
    synchronize(*s);
  }
  // The other way (device memory into host memory the host then reads), for diagnostics read once
  // the work that writes `src` completed; a copy either way (cudaMemcpyDefault) on CUDA.
  virtual void download_now(void* dst, const void* src, size_t bytes) { upload_now(dst, src, bytes); }
  // How many blocks a launch of the kernel executor may use when `wanted` items can run in
  // parallel (0: this device has no kernel path).
  virtual unsigned plan_blocks(unsigned wanted) const { return 0 * wanted; }
  // How many blocks of the kernel executor can be resident at once (issue #38, item 4): on the
  // whole device (`device_blocks`: cudaOccupancyMaxActiveBlocksPerMultiprocessor x the SM count)
  // and for this process (`client_blocks`); `mps_client`: MPS's CUDA_MPS_ACTIVE_THREAD_PERCENTAGE
  // scales client_blocks where set (stream/kernel_occupancy.cc applies it); `why` says what they
  // were made of. Blocks beyond them wait for resident ones to finish, so a grid whose blocks wait
  // for each other (and for the other ranks' on the same device) must fit. 0: unknown (no limit).
  struct Residency {
    unsigned device_blocks = 0, client_blocks = 0;
    std::string why;
    bool mps_client = false;
  };
  virtual Residency plan_residency() const { return Residency{0, 0, "unknown"}; }
  // The device's multiprocessors (CUDA: cudaDevAttrMultiProcessorCount; the emulated device:
  // COMMLIB_EMULATED_SMS, read when asked): the one-sided kernel's grid is at most this, a block per
  // SM (stream/kernel_occupancy.h). 0: unknown (the grid then stays within kexec::kMaxBlocks).
  virtual unsigned multiprocessors() const { return 0; }
  // An identity of the physical device shared by every process using it (the GPU's UUID on CUDA,
  // "emulated:[<machine>:]N" on the emulated device): ranks with the same one share its resident
  // blocks, and the device-wide grid budget's ledger is named by it (stream/grid_claims.h).
  virtual std::string physical_id() const { return name(); }
  // Enqueues the kernel executor (kernels/plan_kernel.cuh) over `blocks` blocks, with the element
  // functor of (dtype, op) when the plan reduces.
  virtual void launch_plan(const kexec::PlanLaunch&, unsigned, DType, RedOp, bool, DeviceStream&) {
    throw std::runtime_error(name() + ": no kernel path on this device");
  }
};

inline const char* capture_mode_name(CaptureMode m) {
  return m == CaptureMode::Global ? "global" : m == CaptureMode::ThreadLocal ? "thread_local" : "relaxed";
}

// The calling thread's capture mode for a scope (cudaThreadExchangeStreamCaptureMode, push/pop):
// the engine's own threads (the watchdog) query events while a user may capture in Global mode.
class CaptureModeScope {
 public:
  CaptureModeScope(Device& d, CaptureMode m) : d_(d), previous_(d.exchange_capture_mode(m)) {}
  ~CaptureModeScope() { d_.exchange_capture_mode(previous_); }
  CaptureModeScope(const CaptureModeScope&) = delete;
  CaptureModeScope& operator=(const CaptureModeScope&) = delete;

 private:
  Device& d_;
  CaptureMode previous_;
};

// This device current on the calling thread for a scope, the previous one restored after: every
// method of the engine that enqueues or queries takes one (kernels launched on another device's
// stream fail; a thread that never set a device creates a context on device 0). A guard nested in
// a guard of the same device on the same thread makes no driver call (Device::swap_current): that
// device is current already, so one call pays for one guard (a cudaGetDevice), not one per method
// it goes through (issue #37). The device, not this class, knows its guards: the CUDA device's
// own methods guard themselves inside commlib._C_cuda, which shares no thread-local with commlib._C.
class DeviceGuard {
 public:
  explicit DeviceGuard(Device& d) : d_(d), token_(d.swap_current()) {}
  ~DeviceGuard() { d_.restore_current(token_); }
  DeviceGuard(const DeviceGuard&) = delete;
  DeviceGuard& operator=(const DeviceGuard&) = delete;

 private:
  Device& d_;
  const Device::CurrentToken token_;
};

}  // namespace commlib
