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
// What `auto` runs for an all_reduce or a reduce_scatter on the kernel path (issues #25, #38):
// the candidate the kernel path's cost model (policy/device_cost.h) predicts fastest on the route
// the call takes (mapped, staged in the arena, staged through the slots). The policy's size rule
// picks recursive doubling for small all_reduce on one host: log2 P steps, each a flag round trip
// between ranks inside the kernel; custom all-reduce kernels on one host use a one-shot or a
// two-shot instead, so those are the candidates:
//   - all_reduce: `direct` (the one-shot: one round), `two_shot` (a direct reduce-scatter and
//     all-gather through the slots), and every one-sided algorithm (`mapped_one_shot`,
//     `mapped_two_shot`, `mapped_fused_two_shot`: in place on mapped buffers, or staged);
//   - reduce_scatter: the policy's algorithm and the one-sided ones (`mapped`, `mapped_fused`).
// The model ranks by memory traffic, waits in sequence and grid barriers (device_cost.h). On the
// copy path a one-shot's P - 1 messages per rank are P - 1 copy-engine copies and flag waits each,
// a different trade-off, so there the policy's choice stands.
//
// The rule applies only to a call the kernel path runs:
//   - the call asks for auto and is an all_reduce or a reduce_scatter of 2 ranks or more;
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
//      kernel_path) for this world size and size wins: a measurement beats the model;
//   2. where each rank receives at most kOneShotBytes ((P - 1) x the message, or the output block):
//      `direct` for an all_reduce on a staged route, the policy's algorithm for a reduce_scatter.
//      There the handshakes decide, and the model has no fit on those routes: its constants come
//      from 64 and 256 MiB calls, and session 14's one measurement of small calls (8 B at 4 ranks,
//      before the one-block plans) ran ring's six waits faster than direct's one (68 against 92 us).
//      An all_reduce on mapped buffers is the model's at every size: session 31's H200 run measured
//      every candidate there from 16 B to 1 MiB, and the model (its waits corrected then) picks what
//      ran fastest: direct up to 8 KiB (one block), the fused two-shot from 16 KiB (46 us at 64 KiB,
//      where rule 2's direct took 412; docs/gpu.md "Device auto by the cost model");
//   3. the model's fastest candidate on the call's route; on the slots' route only the one-sided
//      candidates whose staged buffers fit the slots area (a larger call is refused there, and the
//      message plans stream any size through the slots). The choice is memoised per (collective,
//      ranks, count, element size, route, slots area, policy choice), and a prepared call (the C++
//      entry's cache) holds the plan of every route it may take: no per-call scan.
// Where every rank's buffers are mapped the model takes `mapped_fused_two_shot` (2 N of traffic:
// every input block read once, the sum stored into every rank's output) from a few hundred KiB per
// rank, staged in the arena the same algorithm a little higher (6 N with the copies in and out,
// against two_shot's 8.75 N at the message plans' lower rate), through the slots higher still (one
// more handshake), and `direct` below (one wait in sequence instead of two). docs/gpu.md "Device
// auto by the cost model" tabulates the predictions.
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
#include <vector>

#include "common/topology.h"
#include "common/types.h"
#include "policy/device_cost.h"

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

// Each rank receives at most this (P - 1 messages, or P - 1 output blocks): the one-shot's regime (rule 2).
constexpr uint64_t kOneShotBytes = uint64_t{256} << 10;

// What the rule reads of the engine, all known when it is created but the route.
struct KernelAutoInputs {
  bool device_has_kernel_path = false;  // Device::plan_blocks(1) > 0
  DevicePath path = DevicePath::Auto;   // COMMLIB_DEVICE_PATH
  bool nccl_links = false;              // COMMLIB_DEVICE_LINK=nccl
  uint64_t kernel_max_bytes = kKernelPathMaxBytes;  // auto's crossover (kernel_path_crossover)
  // The route the call takes: Mapped where every rank's input and output of this call are mapped
  // in every peer (agreed per call by the ranks' registrations: StreamEngine::agree_route, the same
  // on every rank by construction), else staged: Arena under COMMLIB_DEVICE_STAGING=pool while
  // every rank shares an arena (turned off alike on every rank), Slots otherwise and for captured
  // calls. Before connect: the setting's staged route.
  DeviceRoute route = DeviceRoute::Slots;
  // The slots area (KernelPath::staging_capacity()): a one-sided plan staged through the slots
  // must fit it (0: none fits, e.g. before connect).
  uint64_t slots_bytes = 0;
  // The model's constants, with the grid settings this engine's kernel path runs: one_block_bytes
  // COMMLIB_DEVICE_LL_BYTES (a message plan's one-block rule), block_bytes COMMLIB_DEVICE_BLOCK_BYTES
  // (a one-sided plan's grid); the defaults are the settings' defaults.
  DeviceCostParams cost;
};

// A call's shape as the rule reads it: `count` elements of `elem_bytes` (`bytes` their product);
// `requested` 0 for auto; the host policy's choice (`policy_algorithm`, decided by `policy_source`:
// AlgorithmChoice::source).
struct KernelAutoCall {
  Collective coll = Collective::AllReduce;
  uint8_t requested = 0;
  int64_t count = 0;
  int elem_bytes = 1;
  std::string policy_algorithm;
  std::string policy_source;
  uint64_t bytes() const { return static_cast<uint64_t>(count) * static_cast<uint64_t>(elem_bytes); }
};

// Whether the rule would run a one-sided algorithm for this call if every rank's buffers were
// mapped (the model's choice on the mapped route): the calls whose route the ranks agree on first.
// (Where the mapped route's choice is a message plan, every staged route's is the same one: a
// one-sided plan costs at least as much staged as mapped, a message plan the same on any route.)
bool kernel_auto_may_map(int size, const Topology& topology, const KernelAutoInputs& in, const KernelAutoCall& call);

// The algorithm index (registry.h) the kernel path's auto asks for instead of the policy's choice,
// or 0 to keep the policy's, for `call` on a communicator of `size` ranks over `topology`.
uint8_t kernel_auto_algorithm(int size, const Topology& topology, const KernelAutoInputs& in, const KernelAutoCall& call);

// Rules 2 and 3 alone (no tuning row, whatever the engine): what the rule takes for `call` on `route`.
std::string kernel_auto_choice(const KernelAutoCall& call, int size, DeviceRoute route, uint64_t slots_bytes,
                               const DeviceCostParams& params = {});

// The device's own choice where the host policy's algorithm is host-engine only (kHostOnly, e.g. the
// host tuning table's "shared" broadcast rows, measured on the host engine's shared-memory write):
// the built-in heuristic for the call's size (auto_policy.h builtin_algorithm), which every rank
// reads alike. "" where the policy's choice stands: a named algorithm, an override
// (COMMLIB_ALGO_<COLLECTIVE>), or an algorithm any engine runs.
std::string device_fallback_algorithm(const KernelAutoCall& call, int size);

// One candidate as the model ranks it (kernel_auto_candidates).
struct KernelAutoCandidate {
  std::string algorithm;
  DeviceCost cost;
  bool fits = true;  // runs on the route (a one-sided plan through the slots: its staging fits)
};
// The rule's candidates for `coll` (the policy's `policy_algorithm` among a reduce_scatter's) on
// `route`, with the model's costs, in the order the rule breaks ties (the first fastest wins).
std::vector<KernelAutoCandidate> kernel_auto_candidates(Collective coll, int size, int64_t count, int elem_bytes,
                                                        DeviceRoute route, uint64_t slots_bytes,
                                                        const std::string& policy_algorithm,
                                                        const DeviceCostParams& params = {});

}  // namespace commlib
