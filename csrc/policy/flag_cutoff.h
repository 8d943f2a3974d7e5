// The largest call auto sends through the shared-memory flags (host/flag_calls.cc: one write per
// rank, read by every rank, instead of the schedule) per collective and world size. Without an
// entry that is every call whose input fits a flag slot (8 KiB); but near the slot's size a
// schedule can be faster on some machines (the Intel Xeon VMs' all_reduce at 8 KiB: the flags'
// median 1.08x the best algorithm's over 18 runs, bench/RESULTS_collectives.md), so `commlib tune`
// measures it: the tuning file's "flags" section holds, per collective and world size, the largest
// call (auto's bytes: per-rank count x element size) that still goes through the flags, -1 for
// none (commlib/core/tuning.py, commlib/bench/flag_tuning.py).
#pragma once

#include <cstdint>
#include <limits>
#include <map>

#include "common/types.h"

namespace commlib {

constexpr int64_t kFlagsAnySize = std::numeric_limits<int64_t>::max();  // no entry: the slot decides

// Replaces the whole table ({collective: {world size: max call bytes, -1 none}}); checks every
// entry first (std::invalid_argument naming it) and bumps the tuning generation
// (policy/auto_policy.h), so every communicator drops its plans and each plan reads its call's
// cutoff once (plan/plan_cache.h ResolvedPlan::flags_max). Thread-safe.
void set_flag_cutoffs(const std::map<Collective, std::map<int, int64_t>>& table);
void clear_flag_cutoffs();
// The cutoff of (c, size), kFlagsAnySize without an entry (under the table's lock).
int64_t flag_cutoff(Collective c, int size);

}  // namespace commlib
