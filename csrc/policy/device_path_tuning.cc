// See device_path_tuning.h.
#include "policy/device_path_tuning.h"

#include <mutex>
#include <stdexcept>
#include <string>

namespace commlib {

namespace {
std::mutex g_mu;
std::map<int, int64_t> g_crossovers;
}  // namespace

void set_device_path_crossovers(std::map<int, int64_t> kernel_max_bytes) {
  for (const auto& [size, bytes] : kernel_max_bytes) {
    if (size < 1) throw std::invalid_argument("device_path: world size must be >= 1, got " + std::to_string(size));
    if (bytes < 0)
      throw std::invalid_argument("device_path: kernel_max_bytes must be >= 0, got " + std::to_string(bytes) +
                                  " for world size " + std::to_string(size));
  }
  std::lock_guard<std::mutex> lk(g_mu);
  g_crossovers = std::move(kernel_max_bytes);
}

uint64_t device_path_crossover(int size, uint64_t fallback) {
  std::lock_guard<std::mutex> lk(g_mu);
  const auto it = g_crossovers.find(size);
  return it == g_crossovers.end() ? fallback : static_cast<uint64_t>(it->second);
}

}  // namespace commlib
