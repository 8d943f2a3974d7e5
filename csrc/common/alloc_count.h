// Heap allocations made by commlib's own C++ code on the calling thread, for the tests that pin
// the device hot path at none (issue #37, item 2; tests/stream/test_call_counts.py). The module is
// linked with --wrap for operator new and new[] (setup.py), so every new-expression compiled into
// commlib, the standard containers' and make_shared's included, goes through a counting wrapper
// (common/alloc_count.cc); nothing else in the process is affected (Python's allocator, other
// libraries). Not counted: allocations inside libstdc++'s own compiled code (std::string's growth
// is there), malloc called directly.
#pragma once

#include <cstdint>

namespace commlib {

uint64_t thread_allocations();

// Allocations in scope are the device's own, not its caller's: the emulated device's closures and
// block threads stand in for the CUDA driver's internal work (device/emulated), which a count of
// the engine's allocations leaves out.
class UncountedAllocations {
 public:
  UncountedAllocations();
  ~UncountedAllocations();
  UncountedAllocations(const UncountedAllocations&) = delete;
  UncountedAllocations& operator=(const UncountedAllocations&) = delete;
};

}  // namespace commlib
