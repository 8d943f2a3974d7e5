// NCCL loaded at run time: dlopen of libnccl (the nvidia-nccl-cu12 / -cu13 wheels ship
// libnccl.so.2 under site-packages/nvidia/nccl/lib), no NCCL at build time. The function table
// is what the `nccl` link and algorithm="nccl" call (stream/nccl_link.h); opaque handles and
// enums are declared here with NCCL's ABI (nccl.h), so no NCCL header is needed either. A device
// may provide its own implementation of the same table (Device::nccl_api(); the emulated device's
// is device/emulated/nccl_emulated.h), which libnccl's leaves out the extensions of.
#pragma once

#include <cstddef>
#include <memory>
#include <string>
#include <vector>

namespace commlib {

class Device;

struct NcclUniqueId {
  char internal[128];
};
using NcclComm = struct ncclComm*;
using NcclResult = int;  // ncclResult_t: 0 success

// ncclDataType_t and ncclRedOp_t codes (nccl.h); uint32/uint64 have no commlib dtype.
enum NcclDataType : int {
  kNcclInt8 = 0, kNcclUint8 = 1, kNcclInt32 = 2, kNcclUint32 = 3, kNcclInt64 = 4, kNcclUint64 = 5,
  kNcclFloat16 = 6, kNcclFloat32 = 7, kNcclFloat64 = 8, kNcclBfloat16 = 9
};
enum NcclRedOp : int { kNcclSum = 0, kNcclProd = 1, kNcclMax = 2, kNcclMin = 3, kNcclAvg = 4 };
// ncclResult_t codes the emulated NCCL returns.
enum NcclResultCode : int {
  kNcclSuccess = 0, kNcclSystemError = 2, kNcclInternalError = 3, kNcclInvalidArgument = 4, kNcclInvalidUsage = 5,
  kNcclRemoteError = 6
};

struct NcclApi {
  NcclResult (*GetVersion)(int*);
  const char* (*GetErrorString)(NcclResult);
  NcclResult (*GetUniqueId)(NcclUniqueId*);
  NcclResult (*CommInitRank)(NcclComm*, int, NcclUniqueId, int);
  NcclResult (*CommDestroy)(NcclComm);
  NcclResult (*CommAbort)(NcclComm);
  // The communicator's asynchronous error (a network or remote failure NCCL found in its own
  // threads); thread-safe, polled by the engine's watchdog.
  NcclResult (*CommGetAsyncError)(NcclComm, NcclResult*);
  // The stream argument (void*) is a cudaStream_t; on the emulated NCCL the DeviceStream itself.
  NcclResult (*AllReduce)(const void*, void*, size_t, int, int, NcclComm, void*);
  NcclResult (*AllGather)(const void*, void*, size_t, int, NcclComm, void*);          // sendcount
  NcclResult (*ReduceScatter)(const void*, void*, size_t, int, int, NcclComm, void*); // recvcount
  NcclResult (*Broadcast)(const void*, void*, size_t, int, int, NcclComm, void*);     // root
  NcclResult (*Reduce)(const void*, void*, size_t, int, int, int, NcclComm, void*);   // op, root
  NcclResult (*Send)(const void*, size_t, int, int, NcclComm, void*);
  NcclResult (*Recv)(void*, size_t, int, int, NcclComm, void*);
  NcclResult (*GroupStart)();
  NcclResult (*GroupEnd)();
  // Extensions of a table a device provides (null in libnccl's). UseDevice: the device (and the
  // set-up timeout, seconds) the calling thread's next CommInitRank binds to, where libnccl binds
  // to the current CUDA device. LastError: why the calling thread's last failing call failed
  // (NCCL's result codes say little).
  void (*UseDevice)(std::shared_ptr<Device>, double) = nullptr;
  std::string (*LastError)() = nullptr;
  int version = 0;        // e.g. 22703 for 2.27.3
  std::string path;       // the library that was loaded
};

// Loads the first of `candidates` that dlopen accepts (an empty list: "libnccl.so.2" through the
// loader's search path) and resolves every entry of NcclApi. Once loaded, later calls return the
// same table. Throws std::runtime_error listing what was tried, or naming a missing symbol.
const NcclApi& load_nccl(const std::vector<std::string>& candidates);

}  // namespace commlib
