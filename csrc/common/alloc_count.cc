// See alloc_count.h. The wrappers are the targets of the linker's --wrap=_Znwm / --wrap=_Znam
// (operator new(size_t) and operator new[](size_t)): commlib's references to them land here, and
// __real_ reaches the library's.
#include "common/alloc_count.h"

#include <cstddef>

namespace {
thread_local uint64_t t_allocations = 0;
thread_local int t_uncounted = 0;
}  // namespace

extern "C" {
void* __real__Znwm(size_t n);
void* __real__Znam(size_t n);
__attribute__((visibility("hidden"))) void* __wrap__Znwm(size_t n) {
  if (t_uncounted == 0) ++t_allocations;
  return __real__Znwm(n);
}
__attribute__((visibility("hidden"))) void* __wrap__Znam(size_t n) {
  if (t_uncounted == 0) ++t_allocations;
  return __real__Znam(n);
}
}

namespace commlib {

uint64_t thread_allocations() { return t_allocations; }
UncountedAllocations::UncountedAllocations() { ++t_uncounted; }
UncountedAllocations::~UncountedAllocations() { --t_uncounted; }

}  // namespace commlib
