// check_device_plans (device_plan.h) for schedules of ranks placed on hosts: the hierarchical and
// rail schedules' multi-host shapes (a host map, a pipeline segment, lanes) lowered and checked.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "schedule/ir.h"

namespace commlib {

// As check_device_plans, for `how` (its algorithm, hierarchical phases, segment, pieces) on ranks
// placed by `host_of` (empty: one host). Throws std::runtime_error naming the rank and the difference.
// Returns the chunks checked that cross hosts (0 on one host; what shows the map reached the builder).
int64_t check_device_plans_on_hosts(Collective coll, const Composition& how, int size, const std::vector<int>& host_of,
                                 int64_t count, int root, size_t esize, uint64_t chunk_bytes);

}  // namespace commlib
