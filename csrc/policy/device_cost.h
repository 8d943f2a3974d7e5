// The kernel path's cost model (issue #38): what device auto (device_auto.h) ranks its candidates
// by, per route, where nothing was measured on the kernel path (the tuning file's "kernel_path"
// rows win over it). It is the per-block model docs/gpu.md publishes its GPU predictions from,
// written once here so that auto and the predictions cannot drift apart.
//
// A call's time on the kernel path:
//
//     t = F + W x t_h(P) + G x t_b + T / R
//
//   T  the memory traffic per rank (bytes read + written), counted from the schedule the call runs
//      (rank 0's; the candidates are symmetric) as the kernel path lowers it: a message plan's send
//      writes into the peer's slot and the receive copies out of its own (2n each, a recv_reduce
//      3n), a one-sided get or put moves 2n, a get_reduce 3n, reduce_to_all reads and writes P
//      blocks (2Pb), reduce_from_all reads P and writes one ((P + 1) b), a copy 2n (nothing where
//      staging in place made source and destination one), a reduce 3n. A staged route adds the
//      copies into and out of the staging area of every peer-visible buffer (2 x its bytes each).
//      These are the counts tests/stream/test_one_sided_kernel.py measures on the emulated device
//      (the data and staged bytes of `kernel_counters()`), and the model's test compares with them.
//   W  the cross-rank waits in sequence: the schedule's steps that wait on a peer (a receive, or a
//      one-sided wait; a step's waits overlap), the closing handshake a launch staged through the
//      slots adds (docs/gpu.md "Which buffers take which path"), and a message plan's descriptor
//      check where it is its own exchange: on a grid (some item above COMMLIB_DEVICE_LL_BYTES,
//      8 KiB by default; 0: always a grid), or one block whose plan misses a peer; one block joining every peer folds
//      it into the data handshakes (plan_call_check.cuh). Session 31's H200 run: direct 45.3 us at
//      4 KiB (one block), 73.7 at 16 KiB (a grid).
//   G  grid barriers per block, none on a grid of one block (there the block's own __syncthreads):
//      a message plan one per step and the check's, a one-sided plan one (the descriptor check's),
//      two staged (the copy-in's and the copy-out's); a one-sided grid is a block per
//      COMMLIB_DEVICE_BLOCK_BYTES (256 KiB) of a handshake's region (an all_reduce's 1/P block).
//   R  bytes per second per rank: a one-sided plan's (every block streams its own byte range) or a
//      message plan's (chunks through the slots in lockstep): fitted separately, below.
//
// The constants, from the H200 runs of session 14 (4 ranks on one GPU under MPS, docs/gpu.md
// "Measured on an H200"); nothing else has been measured:
//   F = 7.2 us: one rank's 8 B call replayed from a graph (the launch, the exit, the done word);
//   t_h(P): the rise of that call's time with the ranks: 4.5 us at 2 ranks, 22 us at 4 (t_b = 1 us
//   assumed), linear between, 22 us beyond (more ranks per GPU were never run);
//   R one-sided = 0.975 GB/ms: the slope of mapped_two_shot from 64 to 256 MiB (369 and 1247 us,
//   T = 4.25 N per rank);
//   R message = 0.382 GB/ms: the slope of two_shot (1442 and 6052 us, T = 8.75 N per rank).
// What the model leaves out: message plans' chunking through the slots (ring measured 2673 us at
// 64 MiB where the model says about 1.2 ms: its 2 (P - 1) lockstep steps cost more than W counts),
// so device auto ranks only the candidates of device_auto.h (direct and two_shot, the one-sided
// algorithms, a reduce_scatter's policy choice), not every message plan; small calls' one-block
// plans (session 15) were never measured.
#pragma once

#include <cstdint>
#include <string>

#include "common/types.h"

namespace commlib {

// The route a call on the kernel path takes (stream/stream_one_sided.cc): every rank's buffers
// mapped in every peer, staged in the staging arena (COMMLIB_DEVICE_STAGING=pool, eager calls),
// or staged through the slots (COMMLIB_DEVICE_STAGING=slots, captured calls). A message plan
// runs through the slots on every route; the route changes what a one-sided plan costs.
enum class DeviceRoute : uint8_t { Mapped, Arena, Slots };
const char* device_route_name(DeviceRoute route);

// The model's constants (the header's comment says where each comes from).
struct DeviceCostParams {
  double launch_s = 7.2e-6;                 // F
  double handshake_2_s = 4.5e-6;            // t_h(2)
  double handshake_4_s = 22e-6;             // t_h(4) and beyond
  double grid_barrier_s = 1e-6;             // t_b
  double one_sided_bytes_per_s = 0.975e12;  // R of a one-sided plan, per rank
  double message_bytes_per_s = 0.382e12;    // R of a message plan, per rank
  // The grid settings: device auto passes its kernel path's (StreamEngine::kernel_auto_inputs).
  double one_block_bytes = 8192;            // a message plan whose items are all this small runs on one
                                            // block (COMMLIB_DEVICE_LL_BYTES; 0: never)
  double block_bytes = 262144;              // a one-sided grid's bytes per block per handshake
                                            // (COMMLIB_DEVICE_BLOCK_BYTES)
};
double handshake_seconds(int size, const DeviceCostParams& params = {});

struct DeviceCost {
  double traffic_bytes = 0;  // T: read + written per rank, staged copies included
  double staged_bytes = 0;   // of T, the staged route's copies in and out
  int waits = 0;             // W
  int grid_barriers = 0;     // G
  uint64_t stage_need = 0;   // bytes of staging area the staged routes need (0: nothing staged)
  double seconds = 0;        // t
};

// The model's cost of `algorithm` (registered for `coll`; `one_sided` its kOneSided trait) for a
// call of `count` elements of `elem_bytes` on `size` ranks, on `route` (message plans: any route).
DeviceCost device_call_cost(Collective coll, const std::string& algorithm, int size, int64_t count, int elem_bytes,
                            DeviceRoute route, const DeviceCostParams& params = {});

// The staging area a one-sided call needs (KernelPath::stage_layout's rule, which calls this):
// an all_reduce whose input and output are both peer-visible is staged in place (its input's
// bytes); else the input at 0 and the output after it, aligned to `align`; an output no peer
// reads is not staged.
uint64_t staged_bytes_need(Collective coll, bool input_visible, bool output_visible, uint64_t in_bytes,
                      uint64_t out_bytes, uint64_t align);
constexpr uint64_t kStageAlign = 256;

}  // namespace commlib
