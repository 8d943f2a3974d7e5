// Device auto, decided here and nowhere else (issue #36, step 1): for a call on device buffers, the
// path it takes (NCCL's own collective, the kernel path or the copy path: device_path_of) and, for
// an all_reduce the kernel path runs, the algorithm auto asks for instead of the host policy's
// choice (kernel_auto_algorithm). The stream engine asks these two and decides nothing itself; the
// host policy's own choice (resolve_algorithm, through the plan cache) is the input.
//
// Which path: algorithm="nccl" is NCCL's; else the kernel path where it is usable (connected, every
// rank on this host, a device with kernels, no pair on the nccl link) and COMMLIB_DEVICE_PATH lets it
// take the size (kernel_path_takes: kernel always, auto up to the crossover: the tuning file's
// "device_path" for the world size, policy/device_path_tuning.h, else kKernelPathMaxBytes); else copy.
//
// What `auto` runs for an all_reduce on the kernel path (issue #25):
//
// The policy's size rule picks recursive doubling for small all_reduce on one host: log2 P steps,
// each a grid barrier and a flag round trip between ranks inside the kernel. One launch of the
// one-shot (`direct`: every rank receives every peer's input and reduces, one round) or the
// two-shot (`two_shot`: a direct reduce-scatter, then a direct all-gather, two rounds) is what custom
// all-reduce kernels use on one host instead, so the kernel path asks for those. On the copy path a
// one-shot's P - 1 messages per rank are P - 1 copy-engine copies and flag waits each, a different
// trade-off, so there the policy's choice stands.
//
// The rule applies only to a call the kernel path runs:
//   - the call asks for auto and is an all_reduce of 2 ranks or more (a reduce_scatter: rule 2
//     only, `mapped_fused` on mapped buffers: N read + N / P written per rank against the mapped
//     one's (3P - 1) / P x N and the staged algorithms' copies through the slots; unmapped, the
//     policy's choice stands);
//   - the device has a kernel path, COMMLIB_DEVICE_PATH lets it take a call of this size
//     (kernel_path_takes: kernel, or auto up to its crossover, the tuning file's "device_path" for
//     this world size else kKernelPathMaxBytes: policy/device_path_tuning.h; never copy), COMMLIB_DEVICE_LINK
//     is not nccl (every pair over NCCL: no kernel), and every rank is on one host (the kernel path
//     needs every peer's memory; across hosts host and device resolve auto alike,
//     test_device_multihost.py's test_host_and_device_resolve_auto_alike);
//   - the policy decided by its rules of thumb or the host tuning table (source "size", "links",
//     "tuning": those rows measure the host executor, not these kernels), not by an override
//     (COMMLIB_ALGO_ALL_REDUCE) or COMMLIB_TOPOLOGY's cost model, which keep their word.
// Then, in order:
//   1. a tuning row measured on the kernel path (the tuning file's "kernel_path" section, TuningRow::
//      kernel_path) for this world size and size wins: a measurement beats the rule of thumb;
//   2. where every rank's input and output are mapped (`peers_mapped`, agreed per call) and each
//      rank receives more than kOneShotBytes: the one-sided two-shot, where the kernel path takes
//      the call (at every size by default: kKernelPathMaxBytes). The cost model is the memory
//      traffic per rank pinned on the emulated device: `mapped_fused_two_shot` reads and writes 2 N
//      (every input block read once, the sum stored into every rank's output: no accumulator round
//      trips, no gather step), `mapped_two_shot` (5P - 3) / P x N, the two-shot through the slots
//      about 8.5 N (every byte into a peer's slot, into scratch, then reduced: issue #38); so the
//      fused one, which needs the same mapped buffers and nothing else;
//   3. where the kernel path takes the call: `direct` while each rank receives at most
//      kOneShotBytes ((P - 1) x the message), else `two_shot` (staged through the slots; measured
//      on the H200 at 64 MiB: 1.44 ms against the kernel path's ring 2.67 ms and direct 3.36 ms).
//      The thresholds are from the shape of the traffic and that one measurement.
//
// Every rank must get the same algorithm, and the same before the engines connect as after (the
// first call is described during set-up, before connect, and compared with the peers'
// descriptors). So the rule reads only what a rank knows when its engine is created (and
// `peers_mapped`, which every rank reads from the same registrations of the call): its settings
// (COMMLIB_DEVICE_PATH and COMMLIB_DEVICE_LINK, which connect then checks are the same everywhere),
// the tuning table, the crossover its kernel path read when created (connect checks it too), the device, the host map, the world size and the call; never whether the peers'
// memory got mapped. Ranks that differ in one of those settings resolve auto differently before
// connect; the first call's check lets a difference in the algorithm alone pass to connect, whose
// check names the setting (StreamEngine::check_first_call).
#pragma once

#include <cstdint>
#include <string>

#include "common/topology.h"
#include "common/types.h"

namespace commlib {

// COMMLIB_DEVICE_PATH (parsed by stream/kernel_path.h's device_path_from_env).
enum class DevicePath : uint8_t { Auto, Kernel, Copy };
// auto: the kernel path for calls of at most this many bytes (count x element size), else copy;
// the default where the tuning file has no measured crossover for the world size: no crossover,
// the kernel path at every size. Measured on the H200 (session 14, 4 ranks on one GPU under MPS,
// all_reduce 64 MiB, docs/gpu.md "Measured on an H200"): the kernel path's mapped two-shot 369 us,
// its staged two_shot 1.44 ms, the copy path's ring 92 ms (1.4 ms on an H100 two days earlier,
// itself no faster than the kernel path there). The copy path stays reachable: COMMLIB_DEVICE_PATH=
// copy, or a tuning file's measured crossover ("device_path"). INT64_MAX: it fits the tuning file's
// signed kernel_max_bytes.
constexpr uint64_t kKernelPathMaxBytes = uint64_t{0x7fffffffffffffff};
// Whether `mode` sends a call of `bytes` to the kernel path where that path is usable, auto's
// crossover being `kernel_max_bytes`: the one size rule of device_path_of and kernel_auto_algorithm.
constexpr bool kernel_path_takes(DevicePath mode, uint64_t bytes, uint64_t kernel_max_bytes) {
  return mode == DevicePath::Kernel || (mode == DevicePath::Auto && bytes <= kernel_max_bytes);
}
// auto's crossover for a communicator of `size` ranks: the tuning file's, else kKernelPathMaxBytes
// (an engine reads it once, when created).
uint64_t kernel_path_crossover(int size);

// The path a call on device buffers runs on.
enum class DeviceCallPath : uint8_t { Nccl, Kernel, Copy };
// `kernel_usable`: the engine's kernel path exists and is connected to every rank on this host;
// `nccl_carries_any`: some pair of this rank is on the nccl link (then no kernel: it needs every
// peer's memory).
// `nccl_requested`: algorithm="nccl"; `bytes`: count x element size. (Plain arguments: the plan
// layer's CollectiveCall is above the policy.)
DeviceCallPath device_path_of(bool nccl_requested, uint64_t bytes, DevicePath mode, uint64_t kernel_max_bytes,
                              bool kernel_usable, bool nccl_carries_any);

constexpr uint64_t kOneShotBytes = uint64_t{256} << 10;

// What the rule reads of the engine, all known when it is created.
struct KernelAutoInputs {
  bool device_has_kernel_path = false;  // Device::plan_blocks(1) > 0
  DevicePath path = DevicePath::Auto;   // COMMLIB_DEVICE_PATH
  bool nccl_links = false;              // COMMLIB_DEVICE_LINK=nccl
  uint64_t kernel_max_bytes = kKernelPathMaxBytes;  // auto's crossover (kernel_path_crossover)
  // Every rank's input and output of this call are mapped in every peer (agreed per call by the
  // ranks' registrations: StreamEngine::agree_route). The one input not known when the engine is
  // created, and the same on every rank by construction; false before connect.
  bool peers_mapped = false;
};

// Whether an all_reduce (reduce_scatter) of `bytes` per rank, auto, on the kernel path, would run
// the fused mapped two-shot (mapped_fused) if every rank's buffers were mapped: the calls whose
// route the ranks agree on first.
bool kernel_auto_may_map(int size, const Topology& topology, const KernelAutoInputs& in, Collective coll,
                         uint8_t requested, uint64_t bytes, const std::string& policy_source);

// The algorithm index (registry.h) the kernel path's auto asks for instead of the policy's choice
// (`policy_source`: AlgorithmChoice::source), or 0 to keep the policy's, for a call of `coll` with
// `requested` (0: auto) and `bytes` per rank on a communicator of `size` ranks over `topology`.
uint8_t kernel_auto_algorithm(int size, const Topology& topology, const KernelAutoInputs& in, Collective coll,
                              uint8_t requested, uint64_t bytes, const std::string& policy_source);

}  // namespace commlib
