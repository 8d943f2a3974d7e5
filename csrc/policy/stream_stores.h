// When a collective's copies write with non-temporal (streaming) stores (kernels/cpu_copy.h): the
// local copies and the received chunks a call lands, and the shared broadcast's reads out of the
// root's stream. Streaming skips the read-for-ownership of every destination line, a third of a
// copy's memory traffic, but leaves the data out of the cache: it wins where the call's data cannot
// stay in the cache anyway, and which calls those are depends on the machine. On the AMD EPYC VMs (32
// MiB of L3) 8-16 MiB all_to_all and all_gather on 4 ranks were 15-30% faster streaming; on the Intel
// Xeon VMs (a 480 MiB L3 shared with other guests) no call of the main job was, and out-of-place
// all_gather of 8-16 MiB was 1.35x slower (bench/RESULTS_collectives.md, session 41). So it is
// measured: `commlib bench --stream-ab` times every algorithm with streaming off and on in the same
// rounds, and `commlib tune` writes, per collective and world size, the call size (auto's bytes:
// per-rank count x element size) from which streaming won, -1 for never (the tuning file's "stream"
// section, commlib/core/tuning.py, commlib/bench/stream_tuning.py).
//
// Without an entry, or when COMMLIB_STREAM_BYTES is set, the footprint rule decides: a call whose
// outputs, all ranks together, hold COMMLIB_STREAM_BYTES (default 32 MiB) or more streams.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>

#include "common/types.h"

namespace commlib {

constexpr int64_t kStreamNoEntry = -2;  // the table says nothing: the footprint rule decides
constexpr int64_t kStreamNever = -1;

// Replaces the whole table ({collective: {world size: the smallest call that streams, -1 never}});
// checks every entry first (std::invalid_argument naming it) and bumps the tuning generation
// (policy/auto_policy.h), so every communicator drops its plans and each plan reads its call's
// entry once (plan/plan_cache.h ResolvedPlan::streaming_start). Thread-safe.
void set_streaming_starts(const std::map<Collective, std::map<int, int64_t>>& table);
void clear_streaming_starts();
// The entry of (c, size), kStreamNoEntry without one (under the table's lock).
int64_t streaming_start(Collective c, int size);

// Whether one call streams: `tuned` is its plan's entry (streaming_start), `call_bytes` auto's bytes,
// `footprint` its outputs' bytes on all ranks together; `threshold` COMMLIB_STREAM_BYTES (0: never),
// which decides alone when `use_table` is false (the variable is set) or the table has no entry.
inline bool stream_call(bool use_table, int64_t tuned, int64_t call_bytes, size_t footprint, size_t threshold) {
  if (use_table && tuned != kStreamNoEntry) return tuned >= 0 && call_bytes >= tuned;
  return threshold && footprint >= threshold;
}

}  // namespace commlib
