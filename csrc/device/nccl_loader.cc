#include "device/nccl_loader.h"

#include <dlfcn.h>

#include <mutex>
#include <stdexcept>

namespace commlib {

namespace {

template <typename F>
void resolve(void* lib, const std::string& path, const char* name, F* out) {
  void* sym = dlsym(lib, name);
  if (!sym) throw std::runtime_error(path + " has no symbol " + name + " (not a usable libnccl)");
  *out = reinterpret_cast<F>(sym);
}

}  // namespace

const NcclApi& load_nccl(const std::vector<std::string>& candidates) {
  static std::mutex mu;
  static NcclApi* api = nullptr;  // loaded once, for the process's life (never dlclosed)
  std::lock_guard<std::mutex> lk(mu);
  if (api) return *api;
  std::vector<std::string> tries = candidates.empty() ? std::vector<std::string>{"libnccl.so.2"} : candidates;
  std::string failures;
  for (const std::string& path : tries) {
    void* lib = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (!lib) {
      const char* err = dlerror();
      failures += "\n  " + path + ": " + (err ? err : "dlopen failed");
      continue;
    }
    auto* a = new NcclApi();
    try {
      resolve(lib, path, "ncclGetVersion", &a->GetVersion);
      resolve(lib, path, "ncclGetErrorString", &a->GetErrorString);
      resolve(lib, path, "ncclGetUniqueId", &a->GetUniqueId);
      resolve(lib, path, "ncclCommInitRank", &a->CommInitRank);
      resolve(lib, path, "ncclCommDestroy", &a->CommDestroy);
      resolve(lib, path, "ncclCommAbort", &a->CommAbort);
      resolve(lib, path, "ncclCommGetAsyncError", &a->CommGetAsyncError);
      resolve(lib, path, "ncclAllReduce", &a->AllReduce);
      resolve(lib, path, "ncclAllGather", &a->AllGather);
      resolve(lib, path, "ncclReduceScatter", &a->ReduceScatter);
      resolve(lib, path, "ncclBroadcast", &a->Broadcast);
      resolve(lib, path, "ncclReduce", &a->Reduce);
      resolve(lib, path, "ncclSend", &a->Send);
      resolve(lib, path, "ncclRecv", &a->Recv);
      resolve(lib, path, "ncclGroupStart", &a->GroupStart);
      resolve(lib, path, "ncclGroupEnd", &a->GroupEnd);
      if (a->GetVersion(&a->version) != 0) throw std::runtime_error(path + ": ncclGetVersion failed");
    } catch (...) {
      delete a;
      dlclose(lib);
      throw;
    }
    a->path = path;
    api = a;
    return *api;
  }
  throw std::runtime_error("NCCL: no libnccl could be loaded (install nvidia-nccl-cu12 or -cu13, or set "
                           "COMMLIB_NCCL_LIBRARY); tried:" + failures);
}

}  // namespace commlib
