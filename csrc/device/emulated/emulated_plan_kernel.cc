// The kernel executor on the emulated device: the body of plan_kernel.cuh, unchanged, with one host
// thread per block (real concurrency between blocks, and between ranks, which are processes) and
// one thread per block (blockDim 1, so block_sync has nothing to order). COMMLIB_EMULATED_DELAY_US
// delays the launch like any data operation and, per block, each item by a random part of it, so
// an ordering the flags do not enforce shows up as wrong data.
#include <unistd.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cstring>
#include <thread>
#include <vector>

#include "common/alloc_count.h"
#include "common/params.h"
#include "device/emulated/emulated_device.h"
#include "device/emulated/emulated_kernel_counters.h"
#include "kernels/plan_kernel.cuh"

namespace commlib {

namespace kexec {
thread_local int64_t emu_delay_us = 0;
thread_local uint64_t emu_rng = 0;
thread_local bool emu_in_data = false;

namespace {
std::array<std::atomic<uint64_t>, kEmuCounters> counters{};
}  // namespace

void emu_count(EmuCounter c, uint64_t n) { counters[c].fetch_add(n, std::memory_order_relaxed); }
thread_local uint64_t emu_loaded = 0, emu_stored = 0;  // plan_atomics.cuh's data_load / data_store
}  // namespace kexec

std::array<uint64_t, kexec::kEmuCounters> emulated_kernel_counters() {
  std::array<uint64_t, kexec::kEmuCounters> out{};
  for (unsigned c = 0; c < kexec::kEmuCounters; ++c) out[c] = kexec::counters[c].load(std::memory_order_relaxed);
  return out;
}

void reset_emulated_kernel_counters() {
  for (auto& c : kexec::counters) c.store(0, std::memory_order_relaxed);
}

namespace {

using namespace kexec;

constexpr unsigned kEmulatedMaxBlocks = 4;  // host threads per launch

using Body = void (*)(const PlanLaunch&);

template <class F>
void body(const PlanLaunch& a) {
  run_plan(a, F{});
}

struct BodyOf {
  Body out = nullptr;
  template <DType D, class Op>
  void reduce() {
    out = &body<gpu::ReduceElem<D, Op>>;
  }
};

std::atomic<uint64_t> launches{0};

}  // namespace

void EmulatedDevice::upload_now(void* dst, const void* src, size_t bytes) {
  enter("cudaMemcpy", false, true);  // synchronous: a capture may prohibit it
  if (bytes) std::memcpy(dst, src, bytes);
}

unsigned EmulatedDevice::plan_blocks(unsigned wanted) const {
  return std::max(1u, std::min(wanted, kEmulatedMaxBlocks));
}

unsigned EmulatedDevice::multiprocessors() const {
  return static_cast<unsigned>(param_int("COMMLIB_EMULATED_SMS", 1, kexec::kMaxGrid));
}

Device::Residency EmulatedDevice::plan_residency() const {
  if (!resident_limit_) return Residency{0, 0, "no limit (COMMLIB_EMULATED_RESIDENT_BLOCKS=0)"};
  const std::string why = "COMMLIB_EMULATED_RESIDENT_BLOCKS=" + std::to_string(resident_limit_) + " on " + identity_;
  // An MPS client, as a process on a GPU is (CudaDevice::plan_residency): residency_of applies
  // CUDA_MPS_ACTIVE_THREAD_PERCENTAGE, which EmulatedResidency enforces.
  Residency r{resident_limit_, resident_limit_, why};
  r.mps_client = true;
  return r;
}

// As a GPU's block scheduler: a block waits for a free place on the device (whichever process
// holds the others: emulated_residency.h) and keeps it until it returns. A block waiting here is
// what a grid larger than the device, or two grids sharing it, leave behind: its siblings spin
// until the watchdog's abort word releases them.
void EmulatedDevice::enter_resident() {
  if (residency_) residency_->enter();
}

void EmulatedDevice::leave_resident() {
  if (residency_) residency_->leave();
}

void EmulatedDevice::launch_plan(const PlanLaunch& launch, unsigned blocks, DType dtype, RedOp op, bool reduces,
                                 DeviceStream& stream) {
  enter("the kernel path's launch", true);
  UncountedAllocations device_own;  // the closure and its block threads: the driver's work, not the caller's
  BodyOf pick;
  if (reduces)
    kern::dispatch_reduce(dtype, op, pick);  // throws for a bitwise op on floats, before enqueueing
  else
    pick.out = &body<NoReduce>;
  const Body run = pick.out;
  const int64_t delay = delay_us_;
  const uint64_t seed = (static_cast<uint64_t>(getpid()) << 32) ^ launches.fetch_add(1);
  static_cast<EmulatedStream&>(stream).enqueue_data([this, launch, blocks, run, delay, seed] {
    auto block = [&](unsigned b) {
      enter_resident();
      gridDim = EmuDim3{blocks, 1, 1};
      blockDim = EmuDim3{1, 1, 1};
      blockIdx = EmuDim3{b, 0, 0};
      threadIdx = EmuDim3{0, 0, 0};
      emu_delay_us = delay;
      emu_rng = seed * 0x9e3779b97f4a7c15ull + b;
      run(launch);
      leave_resident();
    };
    std::vector<std::thread> others;
    for (unsigned b = 1; b < blocks; ++b) others.emplace_back(block, b);
    block(0);
    for (std::thread& t : others) t.join();
  });
}

}  // namespace commlib
