#include "device/emulated/emulated_device.h"

#include <fcntl.h>
#include <sched.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <map>
#include <stdexcept>

#include "common/params.h"
#include "device/emulated/emulated_rules.h"
#include "device/emulated/nccl_emulated.h"
#include "device/host_flags.h"

namespace commlib {

namespace {

EmulatedStream& emu(DeviceStream& s) { return static_cast<EmulatedStream&>(s); }

}  // namespace

// Streams: emulated_stream.cc.

// Device

EmulatedDevice::EmulatedDevice(int index, int64_t delay_us, int connections, unsigned resident_blocks)
    : index_(index), delay_us_(delay_us), resident_limit_(resident_blocks), identity_(emulated_identity(index)),
      residency_(resident_blocks ? std::make_unique<EmulatedResidency>(identity_, resident_blocks) : nullptr) {
  for (int i = 0; i < connections; ++i) hardware_queues_.push_back(std::make_shared<HardwareQueue>());
  // Every allocation keeps a memfd open (so peers can import it): raise the soft fd limit.
  rlimit rl{};
  if (getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur < rl.rlim_max) {
    rl.rlim_cur = rl.rlim_max;
    setrlimit(RLIMIT_NOFILE, &rl);
  }
}

EmulatedDevice::~EmulatedDevice() {
  for (auto& [ptr, a] : allocations_) {
    munmap(ptr, a.bytes);
    close(a.fd);
  }
  for (auto& [ptr, bytes] : imports_) munmap(ptr, bytes);
}

namespace {
// The calling thread's driver calls, every emulated device together (emulated_thread_driver_calls).
thread_local std::unordered_map<const char*, uint64_t> t_calls;

void count(const char* what) {
  ++t_calls[what];
}
}  // namespace

std::map<std::string, uint64_t> emulated_thread_driver_calls() {
  std::map<std::string, uint64_t> out;
  for (const auto& [what, n] : t_calls) out[what] += n;
  return out;
}

void EmulatedDevice::enter(const char* what, bool needs_current, bool unsafe) {
  emulated_enter(what, index_, needs_current);
  if (unsafe) emulated_check_capture_safe(what);
  count(what);
  {
    std::lock_guard<std::mutex> lk(calls_mu_);
    ++calls_[what];
  }
  if (faulted_.load(std::memory_order_acquire)) {
    std::lock_guard<std::mutex> lk(mu_);
    throw std::runtime_error(fault_);
  }
}

std::map<std::string, uint64_t> EmulatedDevice::driver_calls() {
  std::lock_guard<std::mutex> lk(calls_mu_);
  std::map<std::string, uint64_t> out;  // by name: one literal may sit at several addresses
  for (const auto& [what, n] : calls_) out[what] += n;
  return out;
}

const NcclApi* EmulatedDevice::nccl_api() const { return &emulated_nccl_api(); }

namespace {
// The device this thread's innermost guard made current (-1: no guard): as t_guarded in
// cuda_device.cc, so the emulated device's guards make (and count) what CUDA's make.
thread_local int t_guarded = -1;
}  // namespace

void EmulatedDevice::make_current() {
  emulated_set_current_device(index_);
  if (t_guarded >= 0) t_guarded = index_;  // inside a guard: its end sets the previous device back
}

// Counted as CudaDevice makes them (cuda_device.cc): a get, and a set only where the device
// changes; nothing in a guard of this device.
Device::CurrentToken EmulatedDevice::swap_current() {
  CurrentToken token{index_, t_guarded};
  if (t_guarded == index_) return token;
  token.previous = emulated_current_device();
  count("cudaGetDevice");
  if (std::max(token.previous, 0) != index_) count("cudaSetDevice");  // CUDA reports device 0 on a fresh thread
  emulated_set_current_device(index_);
  t_guarded = index_;
  return token;
}

void EmulatedDevice::restore_current(CurrentToken token) {
  if (token.previous != index_ || t_guarded != index_) {
    if (token.previous >= 0) count("cudaSetDevice");
    emulated_set_current_device(token.previous);  // (-1: the thread had none, as before the guard)
  }
  t_guarded = token.enclosing;
}

void EmulatedDevice::inject_fault(const std::string& kind) {
  if (kind == "out_of_memory") return oom_next_.store(true);  // the next allocate alone fails (_memory.cc)
  if (kind != "illegal_address") throw std::invalid_argument("kind: unknown fault '" + kind + "' (known: illegal_address, out_of_memory)");
  std::vector<std::shared_ptr<EmulatedStream>> live;
  {
    std::lock_guard<std::mutex> lk(mu_);
    fault_ = "cudaErrorIllegalAddress (emulated, injected on " + name() +
             "): an illegal memory access was encountered; the device is unusable from now on";
    faulted_.store(true, std::memory_order_release);
    for (auto& w : streams_)
      if (auto st = w.lock()) live.push_back(std::move(st));
  }
  for (auto& st : live) st->fault();
}

std::string EmulatedDevice::fault() {
  std::lock_guard<std::mutex> lk(mu_);
  return fault_;
}

void EmulatedDevice::launch_host_kernel(std::function<void()> fn, DeviceStream& stream) {
  enter("a kernel launch", true);
  emu(stream).enqueue(std::move(fn));
}

std::shared_ptr<DeviceStream> EmulatedDevice::create_stream() {
  enter("cudaStreamCreate");
  std::lock_guard<std::mutex> lk(mu_);
  auto s = std::make_shared<EmulatedStream>(delay_us_, hardware_queues_[streams_created_++ % hardware_queues_.size()]);
  streams_.erase(std::remove_if(streams_.begin(), streams_.end(),
                                [](const std::weak_ptr<EmulatedStream>& w) { return w.expired(); }),
                 streams_.end());
  streams_.push_back(s);
  return s;
}

std::shared_ptr<DeviceStream> EmulatedDevice::stream_named(uintptr_t id) {
  std::lock_guard<std::mutex> lk(mu_);
  if (id == 0) return default_stream_.lock();
  for (const std::weak_ptr<EmulatedStream>& w : streams_) {
    std::shared_ptr<EmulatedStream> s = w.lock();
    if (s && reinterpret_cast<uintptr_t>(static_cast<DeviceStream*>(s.get())) == id) return s;
  }
  return nullptr;
}

void EmulatedDevice::set_default_stream(const std::shared_ptr<DeviceStream>& stream) {
  std::lock_guard<std::mutex> lk(mu_);
  default_stream_ = std::dynamic_pointer_cast<EmulatedStream>(stream);
}

void EmulatedDevice::synchronize(DeviceStream& stream) {
  enter("cudaStreamSynchronize", false, true);
  if (std::shared_ptr<EmulatedCapture> c = emu(stream).capture())
    emulated_capture_conflict(c, "cudaErrorStreamCaptureUnsupported", "cudaStreamSynchronize on a capturing stream");
  emu(stream).synchronize();
  enter("cudaStreamSynchronize");
}

void EmulatedDevice::copy(void* dst, const void* src, size_t bytes, DeviceStream& stream) {
  enter("cudaMemcpyAsync");
  if (!bytes) return emu(stream).enqueue_data([] {});
  emu(stream).enqueue_data([dst, src, bytes] { std::memmove(dst, src, bytes); });
}

void EmulatedDevice::reduce(void* dst, const void* src, size_t n, DType dtype, RedOp op, DeviceStream& stream) {
  enter("a reduction kernel launch", true);
  emu(stream).enqueue_data(emulated_reduce_kernel(dst, src, n, dtype, op));
}

void EmulatedDevice::scale_copy(void* dst, const void* src, size_t n, DType dtype, double scale, DeviceStream& stream) {
  enter("a scale kernel launch", true);
  emu(stream).enqueue_data(emulated_scale_kernel(dst, src, n, dtype, scale));
}

void EmulatedDevice::divide(void* dst, size_t n, DType dtype, int64_t divisor, DeviceStream& stream) {
  enter("a divide kernel launch", true);
  emu(stream).enqueue_data(emulated_divide_kernel(dst, n, dtype, divisor));
}

// The gated operations: the stop word is read when the stream reaches the operation, as the CUDA
// kernels read it when they start (kernels/cuda_reduce.cu); null: not gated (counted apart).
void EmulatedDevice::copy_unless(const uint64_t* stop, void* dst, const void* src, size_t bytes, DeviceStream& stream) {
  enter(stop ? "a gated copy kernel launch" : "a copy kernel launch", true);
  emu(stream).enqueue_data([stop, dst, src, bytes] {
    if (bytes && !(stop && load_flag(stop))) std::memmove(dst, src, bytes);
  });
}

void EmulatedDevice::reduce_unless(const uint64_t* stop, void* dst, const void* src, size_t n, DType dtype, RedOp op,
                                   DeviceStream& stream) {
  enter(stop ? "a gated reduction kernel launch" : "a reduction kernel launch", true);
  emu(stream).enqueue_data([stop, kernel = emulated_reduce_kernel(dst, src, n, dtype, op)] {
    if (!(stop && load_flag(stop))) kernel();
  });
}

void EmulatedDevice::divide_unless(const uint64_t* stop, void* dst, size_t n, DType dtype, int64_t divisor,
                                   DeviceStream& stream) {
  enter(stop ? "a gated divide kernel launch" : "a divide kernel launch", true);
  emu(stream).enqueue_data([stop, kernel = emulated_divide_kernel(dst, n, dtype, divisor)] {
    if (!(stop && load_flag(stop))) kernel();
  });
}

void EmulatedDevice::write_value(uint64_t* addr, uint64_t value, DeviceStream& stream) {
  enter("cuStreamWriteValue64");
  emu(stream).enqueue([addr, value] { store_flag(addr, value); });
}

void EmulatedDevice::wait_value(const uint64_t* addr, uint64_t value, DeviceStream& stream) {
  enter("cuStreamWaitValue64");
  // The closing flag of the stream that runs it (a replayed graph's: emulated_capture.h).
  emu(stream).enqueue([addr, value] { wait_flag(addr, value, emulated_running_abandon()); });
}

void EmulatedDevice::host_func(std::function<void()> fn, DeviceStream& stream) {
  enter("cudaLaunchHostFunc");
  emulated_count_host_function();
  // The stream waits while the process's one host-function thread runs fn (emulated_rules.h).
  emu(stream).enqueue([fn = std::move(fn)]() mutable { run_host_function(std::move(fn)); });
}

namespace {

// Devices live as long as the process, like a GPU: operations still queued on a stream may refer
// to the device (stream-ordered frees), and streams may outlive every other reference. Never
// destroyed, so no exit-time destructor races a stream thread.
struct Devices {
  std::mutex mu;
  std::map<int, std::shared_ptr<EmulatedDevice>> by_index;
};
Devices& devices_of_process() {
  static auto* d = new Devices();
  return *d;
}

}  // namespace

int emulated_device_of(const void* ptr, bool counted) {
  if (counted) count("cuPointerGetAttributes");
  Devices& all = devices_of_process();
  std::lock_guard<std::mutex> lk(all.mu);
  for (const auto& [index, d] : all.by_index)
    if (d->range_of(ptr).bytes) return index;
  return -1;
}

std::shared_ptr<EmulatedDevice> emulated_device(int index) {
  Devices& all = devices_of_process();
  auto* devices = &all.by_index;
  if (index < 0) throw std::invalid_argument("device: emulated device index must be >= 0, got " + std::to_string(index));
  std::lock_guard<std::mutex> lk(all.mu);
  auto it = devices->find(index);
  if (it != devices->end()) return it->second;
  const int64_t delay = param_int("COMMLIB_EMULATED_DELAY_US", 0, 10'000'000);
  const int connections = static_cast<int>(param_int("COMMLIB_EMULATED_CONNECTIONS", 1, 32));
  const auto resident = static_cast<unsigned>(param_int("COMMLIB_EMULATED_RESIDENT_BLOCKS", 0, 4096));
  auto d = std::make_shared<EmulatedDevice>(index, delay, connections, resident);
  (*devices)[index] = d;
  return d;
}

}  // namespace commlib
