// Which vector path the CPU reduction kernels use (selected once at run time from CPUID; see
// cpu_reduce.cc). Exposed for the INFO log, the benchmark report and tests.
#pragma once

#include <string>
#include <vector>

namespace commlib {

// The path in use: "avx512", "avx2" or "baseline" (SSE2 on x86-64, the compiler's default
// elsewhere). COMMLIB_CPU_PATH=baseline|avx2|avx512 caps the choice at load time.
const char* cpu_reduce_path();

// Paths this CPU can run, best first.
std::vector<std::string> cpu_reduce_paths_supported();

// Switch paths (tests compare every path against the reference). Throws std::invalid_argument
// naming "path" for an unknown or unsupported path. Returns the previous path.
std::string set_cpu_reduce_path(const std::string& path);

}  // namespace commlib
