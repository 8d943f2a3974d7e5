// The CUDA implementation of the device interface (cuda_device.cc; compiled into commlib._C_cuda
// only, never into the core). See device/device.h for the semantics.
#pragma once

#include <map>
#include <memory>

#include "device/device.h"

namespace commlib {

class CudaDevice final : public Device {
 public:
  explicit CudaDevice(int index);

  std::string name() const override { return "cuda:" + std::to_string(index_); }
  void make_current() override;
  CurrentToken swap_current() override;
  void restore_current(CurrentToken token) override;

  void* allocate(size_t bytes) override;
  void free_async(void* ptr, DeviceStream& stream) override;
  void* allocate_ordered(size_t bytes, DeviceStream& stream) override;  // cudaMallocAsync
  void free_ordered(void* ptr, DeviceStream& stream) override;          // cudaFreeAsync
  uint64_t* map_host(void* host, size_t bytes) override;
  void unmap_host(void* host) override;

  MemoryRange memory_range(const void* ptr) override;  // cuPointerGetAttributes (cuda_device_ranges.cc)
  std::string export_memory(void* ptr) override;
  void* import_memory(const std::string& handle) override;
  void close_import(void* ptr) override;
  size_t imported_bytes(void* ptr) override;  // cuPointerGetAttributes (cuda_device_ranges.cc)

  std::shared_ptr<DeviceStream> create_stream() override;
  // A stream the caller owns (torch.cuda.current_stream().cuda_stream, a CuPy stream's ptr).
  std::shared_ptr<DeviceStream> wrap_stream(uintptr_t stream);
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
  // Stream capture and graphs: cudaStreamBeginCapture / EndCapture / GetCaptureInfo,
  // cudaThreadExchangeStreamCaptureMode, cudaUserObjectCreate + cudaGraphRetainUserObject,
  // cudaGraphInstantiate, cudaGraphLaunch.
  void begin_capture(DeviceStream& stream, CaptureMode mode) override;
  std::shared_ptr<DeviceGraph> end_capture(DeviceStream& stream) override;
  CaptureStatus capture_status(DeviceStream& stream, uint64_t* id = nullptr) override;
  CaptureMode exchange_capture_mode(CaptureMode mode) override;
  void retain_in_capture(DeviceStream& stream, std::shared_ptr<void> keep) override;
  std::shared_ptr<DeviceGraphExec> instantiate(DeviceGraph& graph) override;
  void launch_graph(DeviceGraphExec& exec, DeviceStream& stream) override;
  unsigned plan_blocks(unsigned wanted) const override;  // kernels/cuda_plan_kernel.cu
  Residency plan_residency() const override;  // cuda_device_ranges.cc
  unsigned multiprocessors() const override;  // cuda_device_ranges.cc
  std::string physical_id() const override;                          // the GPU's UUID
  void launch_plan(const kexec::PlanLaunch& launch, unsigned blocks, DType dtype, RedOp op, bool reduces,
                   DeviceStream& stream) override;

 private:
  const int index_;
  void* write_value64_ = nullptr;  // cuStreamWriteValue64 / cuStreamWaitValue64 (driver)
  void* wait_value64_ = nullptr;
};

// The process's CUDA device `index` (created on first use, lives for the process).
std::shared_ptr<CudaDevice> cuda_device(int index);

}  // namespace commlib
