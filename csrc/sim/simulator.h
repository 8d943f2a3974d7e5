// The simulator (docs/DESIGN.md "Engines": the third engine): plays the registry's schedules on a Topology and
// predicts the collective's time. Event-driven in time order:
//   * a rank enters its next step when its previous step ended (plus step_overhead_s);
//   * a send and its matching receive (FIFO per ordered pair, as the verifier's rendezvous) start
//     when both ranks are in the step holding them, plus op_overhead_s;
//   * a transfer crosses the links on its path (sender's and receiver's ports inside a host, the
//     host's bus if any; the sender's and receiver's NICs between hosts). Each link serves the
//     bytes of its transfers first come, first served, independently of the other links (the
//     bytes stream through, cut-through), so transfers sharing a link queue behind each other
//     (contention) and a transfer ends when its most loaded link has served it;
//   * alone on its path it takes latency + bytes / bottleneck bandwidth; a receive that reduces overlaps the
//     reduction of chunk k with the transfer of chunk k+1 (chunk_bytes), as the executor does;
//   * once every communication op of a step finished, its local copies and reductions run;
//   * a rank whose buffers exceed a memory tier's above_bytes moves and reduces at that tier's rates;
//   * under compress= (Options::codec, codec_cost.h) a message carries its encoded bytes, after the
//     sender's encoding, and its receiver decodes (and reduces) after the last byte;
//   * ranks beyond their host's cores share them (costs and byte rates scale, receives wait for a
//     core), and a receiver whose message comes after its spin window pays a wake-up (topology.h).
// Events are processed in non-decreasing time, so first come, first served is well defined.
#pragma once

#include <cstdint>
#include <limits>
#include <string>
#include <utility>
#include <vector>

#include "common/types.h"
#include "sim/codec_cost.h"
#include "schedule/ir.h"
#include "sim/topology.h"

namespace commlib {
namespace sim {

struct Result {
  double time_s = 0;        // when the last rank finished
  double build_s = 0;       // wall time building and compacting the schedules (or finding them built)
  bool built_cached = false;  // the schedules came built from the cache (compact.h, built_programs)
  double run_s = 0;         // wall time of the event run
  int64_t steps = 0;        // steps played, all ranks
  int64_t transfers = 0;    // matched send/receive pairs
  int64_t bytes_inter = 0;  // bytes that crossed hosts
  int64_t bytes_intra = 0;  // bytes that stayed inside a host
  int64_t shapes = 0;       // distinct step shapes (compaction)
  int64_t max_working_set_bytes = 0;  // largest input + output + scratch bytes of any rank
  int64_t ranks_beyond_cache = 0;     // ranks whose working set put them in a memory tier
  bool cut = false;         // stopped at Options::stop_after_s: time_s is a lower bound (> stop_after_s)
  // The accounting (what bounds time_s): the busiest NIC direction's and rank port direction's
  // seconds of serving bytes, and the busiest rank's CPU seconds of per-message costs (posting
  // sends and taking receives, LogGP's o). time_s minus the largest is what no link or CPU was
  // kept busy by: latencies, steps waiting for their slowest op, local reductions, fill and drain.
  double nic_busy_s = 0;
  double port_busy_s = 0;
  double cpu_busy_s = 0;
};

// What one run did, for the schedule explorer (commlib explain): every rank's steps as (entered,
// finished) in seconds, and every transfer with the links it crossed (ids into link_names).
struct Trace {
  struct Transfer {
    int src, dst;
    int64_t src_step, dst_step;
    double bytes, start, done;  // done: the last byte in at the receiver (wire + latency)
    std::vector<int> links;
  };
  std::vector<std::vector<std::pair<double, double>>> steps;  // [rank][step]
  std::vector<Transfer> transfers;
  std::vector<std::string> link_names;  // "rank 3 out", "host 1 bus", "host 0 NIC 2 in", ...
};

// Empties `trace` for a run on `t`: a step list per rank, and the names of the run's links (trace.cc).
void start_trace(Trace& trace, const Topology& t);

// stop_after_s: stop the event run once simulated time passes it (Result::cut; time_s is then the
// time reached, a lower bound). Events run in time order, so a run stopped there could only have
// finished later: auto's ranking uses it to drop a candidate as soon as it cannot win.
struct Options {
  double stop_after_s = std::numeric_limits<double>::infinity();
  Trace* trace = nullptr;  // filled when given
  CodecCost codec;         // compress=: messages encoded (codec_cost.h); none by default
};

// Plays `how` (schedule/ir.h: a registered algorithm, hierarchical's phases and segment, >= 0) on
// `topo`. The simulator decides nothing: "auto" is the policy's, resolved before it plays
// (policy/auto_policy.h, resolve_on_model: what the simulator's callers use), so the cost model
// stays a leaf under the policy that ranks candidates with it. Checks the call first (check_call).
Result simulate(Collective c, const Composition& how, int64_t count, int elem_bytes, int root,
                const Topology& topo, const Options& opts = Options{});

// What simulate checks of a call before playing it: the topology (Topology::validate), the count,
// the element size, a collective with schedules and its root in range (std::invalid_argument
// naming the argument).
void check_call(Collective c, int64_t count, int elem_bytes, int root, const Topology& topo);

}  // namespace sim
}  // namespace commlib
