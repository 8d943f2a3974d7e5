// The CUDA device's view of allocations and of the resident blocks its kernel executor may use
// (device/device.h: memory_range, resident_plan_blocks, physical_id); split from cuda_device.cc.
#include <cuda.h>
#include <cuda_runtime_api.h>

#include <cstdio>
#include <stdexcept>
#include <string>

#include "device/cuda_check.h"
#include "device/cuda_device.h"
#include "kernels/cuda_plan_kernel.h"

namespace commlib {

namespace {

using GetAttributes = CUresult (*)(unsigned, CUpointer_attribute*, void**, CUdeviceptr);

GetAttributes get_attributes() {
  static GetAttributes fn = [] {
    void* f = nullptr;
    cudaDriverEntryPointQueryResult status{};
    cuda_check(cudaGetDriverEntryPointByVersion("cuPointerGetAttributes", &f, 12000, cudaEnableDefault, &status),
               "cuPointerGetAttributes");
    if (!f || status != cudaDriverEntryPointSuccess) throw std::runtime_error("CUDA driver has no cuPointerGetAttributes");
    return reinterpret_cast<GetAttributes>(f);
  }();
  return fn;
}

}  // namespace

// One driver call. cuPointerGetAttributes, unlike cuPointerGetAttribute, does not fail on a
// pointer CUDA does not know: it leaves the attributes at their defaults (memory type 0).
Device::MemoryRange CudaDevice::memory_range(const void* ptr) {
  CUpointer_attribute attrs[] = {CU_POINTER_ATTRIBUTE_MEMORY_TYPE,     CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL,
                                 CU_POINTER_ATTRIBUTE_RANGE_START_ADDR, CU_POINTER_ATTRIBUTE_RANGE_SIZE,
                                 CU_POINTER_ATTRIBUTE_BUFFER_ID,        CU_POINTER_ATTRIBUTE_IS_LEGACY_CUDA_IPC_CAPABLE};
  unsigned memory_type = 0;
  int ordinal = -1;
  CUdeviceptr start = 0;
  size_t size = 0;
  unsigned long long buffer_id = 0;
  int ipc_capable = 0;  // a bool on the driver's side: the int is zeroed first
  void* data[] = {&memory_type, &ordinal, &start, &size, &buffer_id, &ipc_capable};
  const CUresult r = get_attributes()(6, attrs, data, reinterpret_cast<CUdeviceptr>(ptr));
  if (r != CUDA_SUCCESS || memory_type != CU_MEMORYTYPE_DEVICE || ordinal != index_ || !start) return MemoryRange{};
  return MemoryRange{reinterpret_cast<char*>(start), size, buffer_id, (ipc_capable & 0xff) != 0};
}

// An IPC mapping of a peer's allocation: the driver's range of it (the whole allocation, mapped at
// its start). Not memory_range: that one answers for this device's own memory only.
size_t CudaDevice::imported_bytes(void* ptr) {
  CUpointer_attribute attrs[] = {CU_POINTER_ATTRIBUTE_RANGE_START_ADDR, CU_POINTER_ATTRIBUTE_RANGE_SIZE};
  CUdeviceptr start = 0;
  size_t size = 0;
  void* data[] = {&start, &size};
  const CUresult r = get_attributes()(2, attrs, data, reinterpret_cast<CUdeviceptr>(ptr));
  return r == CUDA_SUCCESS && start == reinterpret_cast<CUdeviceptr>(ptr) ? size : 0;
}

unsigned CudaDevice::multiprocessors() const {
  int sms = 0;
  cuda_check(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, index_), "cudaDeviceGetAttribute");
  return static_cast<unsigned>(sms);
}

Device::Residency CudaDevice::plan_residency() const {
  const int sms = static_cast<int>(multiprocessors());
  const int per_sm = cuda_plan_blocks_per_sm();
  Residency r;
  r.device_blocks = r.client_blocks = static_cast<unsigned>(per_sm * sms);
  r.why = std::to_string(per_sm) + " block(s) per SM (cudaOccupancyMaxActiveBlocksPerMultiprocessor) x " +
          std::to_string(sms) + " SMs";
  r.mps_client = true;  // CUDA_MPS_ACTIVE_THREAD_PERCENTAGE applies (stream/kernel_occupancy.cc reads it)
  return r;
}

// The GPU's UUID, as nvidia-smi prints it: the same in every process whatever CUDA_VISIBLE_DEVICES
// orders, and a MIG instance's own (a PCI bus id is its GPU's, whose SMs the instances split). The
// device-wide grid budget's ledger is named by it (stream/grid_claims.h).
std::string CudaDevice::physical_id() const {
  cudaDeviceProp prop{};
  cuda_check(cudaGetDeviceProperties(&prop, index_), "cudaGetDeviceProperties");
  const auto* b = reinterpret_cast<const unsigned char*>(prop.uuid.bytes);
  char id[64];
  std::snprintf(id, sizeof id, "GPU-%02x%02x%02x%02x-%02x%02x-%02x%02x-%02x%02x-%02x%02x%02x%02x%02x%02x", b[0], b[1],
                b[2], b[3], b[4], b[5], b[6], b[7], b[8], b[9], b[10], b[11], b[12], b[13], b[14], b[15]);
  return std::string("cuda-uuid:") + id;
}

}  // namespace commlib
