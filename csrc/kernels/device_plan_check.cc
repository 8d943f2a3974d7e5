// Every rank's plan of a call checked against its schedule and the pairs across ranks
// (device_plan.h check_device_plans, device_plan_hosts.h).
#include <algorithm>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

#include "kernels/device_list.h"
#include "kernels/device_plan.h"
#include "kernels/device_plan_hosts.h"
#include "kernels/one_sided_plan.h"
#include "schedule/lanes.h"
#include "schedule/registry.h"

namespace commlib {

using namespace kplan;

void check_device_plans(Collective coll, const std::string& algorithm, int size, int64_t count, int root, size_t esize,
                        uint64_t chunk_bytes) {
  check_device_plans_on_hosts(coll, Composition{algorithm}, size, {}, count, root, esize, chunk_bytes);
}

int64_t check_device_plans_on_hosts(Collective coll, const Composition& how, int size, const std::vector<int>& host_of,
                                 int64_t count, int root, size_t esize, uint64_t chunk_bytes) {
  const std::string& algorithm = how.algorithm;
  std::vector<DevicePlan> plans;
  plans.reserve(size);
  CollArgs a{coll, 0, size, count, root};
  a.host_of = host_of;
  a.compose(how);
  bool merged = false;  // some rank's list had its lanes' rounds merged (device_list.h)
  std::vector<std::vector<bool>> merged_step(size);  // per rank and step: it holds two lanes' steps or more
  for (int r = 0; r < size; ++r) {
    a.rank = r;
    const Schedule sched = device_list(build_schedule(a, algorithm), schedule_lanes(a, algorithm), &merged_step[r]);
    merged = merged || std::find(merged_step[r].begin(), merged_step[r].end(), true) != merged_step[r].end();
    plans.push_back(lower_schedule(sched, r, size, esize, chunk_bytes));
    const std::string why = check_device_plan(plans.back(), sched, r, size, esize);
    if (!why.empty())
      throw std::runtime_error("device plan of " + algorithm + " on rank " + std::to_string(r) + " of " +
                               std::to_string(size) + " (count " + std::to_string(count) + "): " + why);
  }
  if (plans[0].one_sided) {
    const std::string why = check_one_sided_pairs(plans, coll, count, esize);
    if (!why.empty())
      throw std::runtime_error("device plans of " + algorithm + " on " + std::to_string(size) + " ranks (count " +
                               std::to_string(count) + "): " + why);
    return 0;
  }
  // Pairs: every chunk rank a sends b is a chunk b receives from a, of the same size. Each plan's
  // check proved its chunk indices per pair run 0..total-1, so a flat array per ordered pair,
  // indexed by chunk, holds what a sends b.
  const std::string of = "device plans of " + algorithm + " on " + std::to_string(size) + " ranks: ";
  auto pair_error = [&](int from, int to, uint32_t chunk) {
    return std::runtime_error(of + "rank " + std::to_string(from) + "'s chunk " + std::to_string(chunk) + " to rank " +
                              std::to_string(to) + " is not received as sent");
  };
  const size_t P = static_cast<size_t>(size);
  std::vector<size_t> start(P * P + 1, 0);  // start[a * P + b]: where a's chunks to b begin
  for (size_t a = 0; a < P; ++a)
    for (size_t b = 0; b < P; ++b) {
      if (plans[a].sends_to[b] != plans[b].recvs_from[a]) {
        const uint32_t fewer = std::min(plans[a].sends_to[b], plans[b].recvs_from[a]);
        throw pair_error(static_cast<int>(a), static_cast<int>(b), fewer);
      }
      start[a * P + b + 1] = start[a * P + b] + plans[a].sends_to[b];
    }
  std::vector<uint32_t> sent_bytes(start.back());
  // A merged step is a whole exchange (device_list.h): every chunk sent or received in one is
  // received at the step index it is sent at, so a step of C concurrent exchanges waits on no later
  // step of a peer's (the kernel's deadlock argument, plan_kernel.cuh, ranks items by step first).
  std::vector<uint32_t> sent_step(merged ? start.back() : 0);
  for (size_t a = 0; a < P; ++a)
    for (uint32_t k = 0; k < plans[a].steps.size(); ++k)
      for (uint32_t j = plans[a].steps[k].first; j < plans[a].steps[k].first + plans[a].steps[k].count; ++j) {
        const PlanItem& it = plans[a].items[j];
        if (it.kind != kSend) continue;
        sent_bytes[start[a * P + it.peer] + it.chunk] = it.bytes;
        if (merged) sent_step[start[a * P + it.peer] + it.chunk] = k;
      }
  for (size_t b = 0; b < P; ++b)
    for (uint32_t k = 0; k < plans[b].steps.size(); ++k)
      for (uint32_t j = plans[b].steps[k].first; j < plans[b].steps[k].first + plans[b].steps[k].count; ++j) {
        const PlanItem& it = plans[b].items[j];
        if (it.kind != kRecv && it.kind != kRecvReduce) continue;
        const size_t at = start[it.peer * P + b] + it.chunk;
        if (sent_bytes[at] != it.bytes) throw pair_error(it.peer, static_cast<int>(b), it.chunk);
        if (merged && sent_step[at] != k && (merged_step[b][k] || merged_step[it.peer][sent_step[at]]))
          throw std::runtime_error(of + "rank " + std::to_string(it.peer) + "'s chunk " + std::to_string(it.chunk) +
                                   " to rank " + std::to_string(b) + " is sent at step " +
                                   std::to_string(sent_step[at]) +
                                   " and received at step " + std::to_string(k) + " of the merged list");
      }
  int64_t across = 0;
  if (!host_of.empty())
    for (size_t a = 0; a < P; ++a)
      for (size_t b = 0; b < P; ++b)
        if (host_of[a] != host_of[b]) across += plans[a].sends_to[b];
  return across;
}

}  // namespace commlib
