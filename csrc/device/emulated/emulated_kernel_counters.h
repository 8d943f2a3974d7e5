// What the emulated device counted of the kernel executor's one-sided launches in this process
// (kexec::EmuCounter, kernels/plan_atomics.cuh), since the process started or the last reset:
// the figures tests pin per algorithm (issue #38 item 5). Counted by emulated_plan_kernel.cc.
#pragma once

#include <array>
#include <cstdint>

#include "kernels/plan_atomics.cuh"

namespace commlib {

std::array<uint64_t, kexec::kEmuCounters> emulated_kernel_counters();
void reset_emulated_kernel_counters();

}  // namespace commlib
