// NCCL loaded at run time: dlopen of libnccl (the nvidia-nccl-cu12 / -cu13 wheels ship
// libnccl.so.2 under site-packages/nvidia/nccl/lib), no NCCL at build time. The function table
// is what the coming `nccl` link and algorithm="nccl" call (docs/gpu.md); opaque handles and
// enums are declared here with NCCL's ABI (nccl.h), so no NCCL header is needed either.
#pragma once

#include <cstddef>
#include <string>
#include <vector>

namespace commlib {

struct NcclUniqueId {
  char internal[128];
};
using NcclComm = struct ncclComm*;
using NcclResult = int;  // ncclResult_t: 0 success

struct NcclApi {
  NcclResult (*GetVersion)(int*);
  const char* (*GetErrorString)(NcclResult);
  NcclResult (*GetUniqueId)(NcclUniqueId*);
  NcclResult (*CommInitRank)(NcclComm*, int, NcclUniqueId, int);
  NcclResult (*CommDestroy)(NcclComm);
  NcclResult (*CommAbort)(NcclComm);
  NcclResult (*AllReduce)(const void*, void*, size_t, int, int, NcclComm, void*);
  NcclResult (*Send)(const void*, size_t, int, int, NcclComm, void*);
  NcclResult (*Recv)(void*, size_t, int, int, NcclComm, void*);
  NcclResult (*GroupStart)();
  NcclResult (*GroupEnd)();
  int version = 0;        // e.g. 22703 for 2.27.3
  std::string path;       // the library that was loaded
};

// Loads the first of `candidates` that dlopen accepts (an empty list: "libnccl.so.2" through the
// loader's search path) and resolves every entry of NcclApi. Once loaded, later calls return the
// same table. Throws std::runtime_error listing what was tried, or naming a missing symbol.
const NcclApi& load_nccl(const std::vector<std::string>& candidates);

}  // namespace commlib
