// The kernel path's settings as each rank reads them, and the check that every rank chose the same
// (kernel_path.h).
#include <algorithm>
#include <stdexcept>
#include <string>

#include "common/params.h"
#include "stream/kernel_path.h"

namespace commlib {

namespace {
constexpr uint64_t kMaxLLBytes = 65536;
}  // namespace

DevicePath device_path_from_env() {
  const std::string v = param_choice("COMMLIB_DEVICE_PATH", {"auto", "kernel", "copy"});
  return v == "kernel" ? DevicePath::Kernel : v == "copy" ? DevicePath::Copy : DevicePath::Auto;
}

const char* device_path_name(DevicePath p) {
  return p == DevicePath::Auto ? "auto" : p == DevicePath::Kernel ? "kernel" : "copy";
}

uint32_t device_ll_bytes_from_env(uint64_t slot_bytes) {
  const uint64_t v = param_bytes("COMMLIB_DEVICE_LL_BYTES");
  if (v % 64 || v > kMaxLLBytes)
    throw std::invalid_argument("COMMLIB_DEVICE_LL_BYTES: expected a multiple of 64 up to 65536, got " +
                                std::to_string(v));
  return static_cast<uint32_t>(std::min(v, slot_bytes));
}

void check_device_paths(const std::vector<std::string>& kernel_handles, DevicePath mine, int rank) {
  for (size_t p = 0; p < kernel_handles.size(); ++p) {
    const std::string theirs = kernel_handles[p].substr(0, kernel_handles[p].find_first_of(",:"));
    if (theirs != device_path_name(mine))
      throw std::invalid_argument("COMMLIB_DEVICE_PATH: rank " + std::to_string(p) + " uses " + theirs + ", rank " +
                                  std::to_string(rank) + " " + device_path_name(mine) + "; every rank must use the same");
  }
}

}  // namespace commlib
