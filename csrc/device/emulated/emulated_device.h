// The emulated device: the device interface on host memory, so the whole GPU engine (stream
// ordering, events, IPC between ranks, every schedule) runs in CI without a GPU.
//
//  - Memory is host memory, each allocation its own memfd mapped shared: another process imports
//    it by opening /proc/<pid>/fd/<fd> (the exporter keeps the fd open while it is allocated), as
//    CUDA IPC imports a peer's allocation. No name ever appears in /dev/shm.
//  - Each stream is a host thread executing its queue in order, asynchronously to the caller.
//  - Events are sequence points on a stream: record enqueues "reached", waits block on it.
//  - Kernels are the CUDA kernels' own bodies (kernels/elementwise_kernel.h) run through host
//    shims for threadIdx/blockIdx, with the launch shape the CUDA launcher would use.
//  - CUDA's rules (device/emulated/emulated_rules.h): host functions run on one thread per process, no
//    device call from inside one, a current device per thread; inject_fault makes the device
//    sticky-failed like a CUDA context after an illegal address (every later call throws, the
//    streams stop executing); importing memory this process exported is refused, as CUDA IPC does.
//  - COMMLIB_EMULATED_DELAY_US (default 0) delays every data operation of a stream (copies and
//    kernels) by that many microseconds before it runs, so work that is not ordered correctly (a
//    missing event or counter wait) reads stale data in tests instead of passing by luck.
//    Synchronisation operations (event records and waits, counter writes and waits, host
//    functions) run undelayed: delaying them too would only slow the tests, since every wrong
//    read is a read that overtook a data operation.
// Several processes with the same device index model several ranks on one GPU (the default: all
// local ranks use emulated device 0).
#pragma once

#include <atomic>
#include <condition_variable>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <thread>
#include <unordered_map>
#include <vector>

#include "device/device.h"
#include "device/emulated/emulated_capture.h"
#include "device/emulated/emulated_residency.h"
#include "device/emulated/emulated_rules.h"

namespace commlib {

class EmulatedStream final : public DeviceStream {
 public:
  // `queue`: the hardware queue it shares with other streams of its device (emulated_rules.h).
  EmulatedStream(int64_t delay_us, std::shared_ptr<HardwareQueue> queue);
  ~EmulatedStream() override;  // drains the queue (waits on peers give up while closing), joins

  // `always`: runs even after a fault (event records, so that waiters wake and see the error).
  void enqueue(std::function<void()> op, bool always = false);
  // A data operation (copy, kernel): delayed by COMMLIB_EMULATED_DELAY_US before it runs.
  void enqueue_data(std::function<void()> op);
  void synchronize();
  // Work enqueued and not yet executed.
  bool busy();
  // Set while the stream is being destroyed: waits on other processes stop waiting.
  const std::atomic<bool>* closing() const { return &closing_; }
  // The device faulted: later operations are skipped, waits on other processes stop.
  void fault();

  // Stream capture (emulated_capture.h): while recording, enqueue adds a node to the capture
  // (depending on the stream's current dependencies) instead of queueing the operation.
  std::shared_ptr<EmulatedCapture> capture();  // null when not capturing
  // Records into `c` from now on, as its lane `lane`, the next node depending on `deps`.
  void start_capture(std::shared_ptr<EmulatedCapture> c, uint32_t lane, std::vector<uint32_t> deps);
  std::vector<uint32_t> capture_deps();                    // what the next node would depend on
  void add_capture_deps(const std::vector<uint32_t>& deps);  // a join (an event wait in the capture)
  // Stops recording into `c` (if it does); returns its last dependencies.
  std::vector<uint32_t> stop_capture(const EmulatedCapture* c);
  // Records a node whose operation is made at each launch of the graph (`bind`, called by
  // launch_graph): an external event wait node reads the event's records as of the launch. False
  // (nothing recorded) when the stream is not capturing.
  bool capture_bound(std::function<std::function<void()>()> bind);

 private:
  void run();
  void delay() const;

  const int64_t delay_us_;
  std::mutex mu_;
  std::condition_variable cv_;
  struct Op {
    std::function<void()> fn;
    bool always;
    uint64_t ticket;  // its place on the hardware queue
  };
  std::deque<Op> queue_;
  std::shared_ptr<HardwareQueue> hw_;
  std::atomic<bool> faulted_{false};
  uint64_t enqueued_ = 0, executed_ = 0;
  // Wake-ups only where someone sleeps: a futex wake per operation shows at small messages.
  bool thread_sleeping_ = false;
  int sync_waiters_ = 0;
  std::shared_ptr<EmulatedCapture> capture_;  // the capture recording this stream's work
  std::vector<uint32_t> capture_deps_;
  uint32_t capture_lane_ = 0;
  std::atomic<bool> closing_{false};
  bool stop_ = false;
  std::thread thread_;
};

class EmulatedDevice final : public Device {
 public:
  EmulatedDevice(int index, int64_t delay_us, int connections = 8, unsigned resident_blocks = 0);
  ~EmulatedDevice() override;

  std::string name() const override { return "emulated:" + std::to_string(index_); }
  const NcclApi* nccl_api() const override;  // the emulated NCCL (nccl_emulated.h)
  void make_current() override;
  CurrentToken swap_current() override;  // as CudaDevice's (cuda_device.cc), counted
  void restore_current(CurrentToken token) override;
  int64_t delay_us() const { return delay_us_; }
  int index() const { return index_; }

  void* allocate(size_t bytes) override;
  // Test hooks on allocation: memory placed at `at` (the address a freed allocation had, as a
  // caching allocator or cudaMalloc may hand it out again; std::runtime_error when it is taken),
  // and memory without a shareable handle (`shareable` false: a VMM allocation without one, a
  // CuPy-style pool's), which memory_range reports and export_memory refuses, as CUDA does.
  void* allocate_with(size_t bytes, void* at, bool shareable);
  // The allocation ptr lies in, its process-unique buffer id and shareability (device.h).
  MemoryRange memory_range(const void* ptr) override;
  // The same without a driver call's checks or count (the emulation's own bookkeeping).
  MemoryRange range_of(const void* ptr);
  // cudaFree: synchronises every stream of the device first (counted when one had work left:
  // emulated_rules.h), then frees at once.
  void free_async(void* ptr, DeviceStream& stream) override;
  // Stream-ordered: no device-wide wait, allowed during another stream's capture; on a capturing
  // stream refused (graph memory nodes are not modelled).
  void* allocate_ordered(size_t bytes, DeviceStream& stream) override;
  void free_ordered(void* ptr, DeviceStream& stream) override;  // in stream order, no wait
  uint64_t* map_host(void* host, size_t) override { return static_cast<uint64_t*>(host); }
  void unmap_host(void*) override {}

  std::string export_memory(void* ptr) override;
  void* import_memory(const std::string& handle) override;
  void close_import(void* ptr) override;
  size_t imported_bytes(void* ptr) override;

  std::shared_ptr<DeviceStream> create_stream() override;
  // The live stream of this device whose identity is `id`, as the C++ entry keys an emulated
  // current stream (bindings/buffer_view.h: the stream object's address, 0 for the default
  // stream), or null: what CudaDevice::wrap_stream is to a cudaStream_t, for a stream the engine
  // has not seen yet (bindings/device_p2p_streams.h). No driver call (CUDA makes none either).
  std::shared_ptr<DeviceStream> stream_named(uintptr_t id);
  // The stream commlib.emulated made its default stream (held weakly: the module holds it).
  void set_default_stream(const std::shared_ptr<DeviceStream>& stream);
  std::shared_ptr<DeviceEvent> create_event() override;
  void record(DeviceEvent& event, DeviceStream& stream) override;
  void wait_event(DeviceStream& stream, DeviceEvent& event) override;
  void wait_event_external(DeviceStream& stream, DeviceEvent& event) override;
  bool query(DeviceEvent& event) override;
  void synchronize(DeviceEvent& event) override;
  void synchronize(DeviceStream& stream) override;

  void copy(void* dst, const void* src, size_t bytes, DeviceStream& stream) override;
  void reduce(void* dst, const void* src, size_t n, DType dtype, RedOp op, DeviceStream& stream) override;
  void scale_copy(void* dst, const void* src, size_t n, DType dtype, double scale, DeviceStream& stream) override;
  void divide(void* dst, size_t n, DType dtype, int64_t divisor, DeviceStream& stream) override;
  void copy_unless(const uint64_t* stop, void* dst, const void* src, size_t bytes, DeviceStream& stream) override;
  void reduce_unless(const uint64_t* stop, void* dst, const void* src, size_t n, DType dtype, RedOp op,
                     DeviceStream& stream) override;
  void divide_unless(const uint64_t* stop, void* dst, size_t n, DType dtype, int64_t divisor,
                     DeviceStream& stream) override;
  void codec_encode(const uint64_t* stop, const CodecSpec& spec, DType dtype, const void* src, size_t n, void* dst,
                    uint64_t counter_base, DeviceStream& stream) override;
  void codec_decode(const uint64_t* stop, const CodecSpec& spec, DType dtype, const void* src, size_t n, void* dst,
                    DeviceStream& stream) override;
  void write_value(uint64_t* addr, uint64_t value, DeviceStream& stream) override;
  void wait_value(const uint64_t* addr, uint64_t value, DeviceStream& stream) override;
  void host_func(std::function<void()> fn, DeviceStream& stream) override;

  // Stream capture and graphs with CUDA's rules (device/emulated/emulated_capture.h).
  void begin_capture(DeviceStream& stream, CaptureMode mode) override;
  std::shared_ptr<DeviceGraph> end_capture(DeviceStream& stream) override;
  CaptureStatus capture_status(DeviceStream& stream, uint64_t* id = nullptr) override;
  CaptureMode exchange_capture_mode(CaptureMode mode) override;
  void retain_in_capture(DeviceStream& stream, std::shared_ptr<void> keep) override;
  std::shared_ptr<DeviceGraphExec> instantiate(DeviceGraph& graph) override;
  void launch_graph(DeviceGraphExec& exec, DeviceStream& stream) override;

  void upload_now(void* dst, const void* src, size_t bytes) override;  // a memcpy: host memory
  // The kernel executor on one host thread per block (device/emulated/emulated_plan_kernel.cc).
  unsigned plan_blocks(unsigned wanted) const override;
  // COMMLIB_EMULATED_RESIDENT_BLOCKS, for the device and for this process alike (0: no limit).
  Residency plan_residency() const override;
  unsigned multiprocessors() const override;  // COMMLIB_EMULATED_SMS
  // "emulated:[<COMMLIB_EMULATED_MACHINE>:]<index>": processes with the same one share the device.
  std::string physical_id() const override { return identity_; }
  // A block of the kernel executor becomes resident (waits while the device, every process using
  // it together, holds the limit: emulated_residency.h) and leaves.
  void enter_resident();
  void leave_resident();
  // The resident blocks' shared ledger (null without a limit).
  const EmulatedResidency* residency() const { return residency_.get(); }
  void launch_plan(const kexec::PlanLaunch& launch, unsigned blocks, DType dtype, RedOp op, bool reduces,
                   DeviceStream& stream) override;
  // Host code standing for a kernel (the emulated NCCL's): runs on the stream's own thread, not
  // on the host-function thread, and may wait for other processes as a kernel spins.
  void launch_host_kernel(std::function<void()> fn, DeviceStream& stream);

  // Makes the device sticky-failed (kind: "illegal_address"), like a CUDA context after an
  // illegal memory access: every later call throws, queued work is skipped. "out_of_memory": the
  // next cudaMalloc (allocate) alone fails as cudaErrorMemoryAllocation does, not sticky (what
  // makes a rank unable to grow its staging arena in the tests).
  void inject_fault(const std::string& kind);
  std::string fault();  // "" while healthy

  // Bytes currently allocated (tests check that nothing leaks).
  size_t allocated_bytes();
  // Driver calls made on this device so far, by the CUDA call each stands for ("cudaEventRecord",
  // "the kernel path's launch", ...): tests pin the structure of a call (one launch, no host
  // function, no cross-stream wait) without timing anything (issue #25, host cost).
  std::map<std::string, uint64_t> driver_calls();

 private:
  struct Allocation {
    int fd;
    size_t bytes;  // what the caller asked for (rounded up to a page), then one page more: the
                   // count of importers mapping it (the IPC rule: no free under a peer's mapping)
    uint64_t buffer_id;  // CU_POINTER_ATTRIBUTE_BUFFER_ID: never reused in this process
    bool shareable;      // CU_POINTER_ATTRIBUTE_IS_LEGACY_CUDA_IPC_CAPABLE
  };
  void release(void* ptr);
  // allocate()'s body, for allocate_ordered (not shareable: a cudaMallocAsync pool's) and the hooks.
  void* allocate_memory(size_t bytes, bool shareable = true, void* at = nullptr);
  // The rules' checks (emulated_rules.h) and the sticky fault, at the top of every call; `unsafe`:
  // a call a stream capture may prohibit (emulated_capture.h).
  void enter(const char* what, bool needs_current = false, bool unsafe = false);

  const int index_;
  const int64_t delay_us_;
  const unsigned resident_limit_;
  const std::string identity_;                    // emulated_identity(index_)
  std::unique_ptr<EmulatedResidency> residency_;  // with a limit
  std::mutex mu_;
  std::map<void*, Allocation> allocations_;  // ordered: memory_range finds the one below an address
  uint64_t next_buffer_id_ = 1;
  std::unordered_map<void*, size_t> imports_;  // mapping -> mapped bytes (the count page included)
  std::atomic<bool> faulted_{false};
  std::atomic<bool> oom_next_{false};  // inject_fault("out_of_memory"): the next allocate fails
  std::string fault_;
  std::vector<std::weak_ptr<EmulatedStream>> streams_;
  std::weak_ptr<EmulatedStream> default_stream_;  // set_default_stream
  std::vector<std::shared_ptr<HardwareQueue>> hardware_queues_;  // COMMLIB_EMULATED_CONNECTIONS
  size_t streams_created_ = 0;
  std::mutex calls_mu_;
  std::unordered_map<const char*, uint64_t> calls_;  // keyed by enter()'s literal
};

// The process's emulated device `index` (created on first use; delay from the environment).
std::shared_ptr<EmulatedDevice> emulated_device(int index);
// The index of the emulated device whose own memory (allocate()d, not imported) holds `ptr`, -1
// for none: where a buffer that names no device lives (__cuda_array_interface__,
// bindings/foreign_arrays.cc). `counted`: counted on this thread as the cuPointerGetAttributes a
// CUDA device needs for it (a DLPack buffer names its device: not counted).
int emulated_device_of(const void* ptr, bool counted);

// Kernel launches on the host (device/emulated/emulated_kernels.cc); throw std::invalid_argument for a
// bitwise op on a floating dtype, like the CUDA entry points. Return the launch to enqueue.
std::function<void()> emulated_reduce_kernel(void* dst, const void* src, size_t n, DType dtype, RedOp op);
std::function<void()> emulated_scale_kernel(void* dst, const void* src, size_t n, DType dtype, double scale);
std::function<void()> emulated_divide_kernel(void* dst, size_t n, DType dtype, int64_t divisor);
// A codec's encode (`encode`) or decode (kernels/codec_kernel.h); throws std::invalid_argument
// naming the argument for a spec or dtype it cannot code (kernels/codec_spec.h's check_codec).
std::function<void()> emulated_codec_kernel(bool encode, const CodecSpec& spec, DType dtype, const void* src, size_t n,
                                            void* dst, uint64_t counter_base);

// The calling thread's driver calls on every emulated device so far, by name, with the current
// device's gets and sets (a device guard: cudaGetDevice, cudaSetDevice where it changes): what one
// call costs on the caller's thread, without the watchdog's queries (tests of issue #37).
std::map<std::string, uint64_t> emulated_thread_driver_calls();

}  // namespace commlib
