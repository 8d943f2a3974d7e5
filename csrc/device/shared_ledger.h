// A small table in /dev/shm that every process of this user on this machine shares (issue #38,
// item 4): the emulated device's resident blocks (emulated/emulated_residency.h) and the device-wide
// grid budget of the kernel path (stream/grid_claims.h). Both are facts about one physical device,
// which many processes use at once, so they cannot live in one process.
//
//  - One operation at a time, under flock(LOCK_EX) on a descriptor the operation opens itself: the
//    kernel drops the lock when its holder dies, so a crash never leaves the table locked, and two
//    threads of one process exclude each other too (each opens its own file description).
//  - The table's only state is who holds what, entries keyed by (pid, the process's start time):
//    a dead holder is recognised (process_alive) and its entries reclaimed by the next operation.
//  - An operation that leaves the table empty unlinks it, still under the lock, so nothing stays
//    in /dev/shm once the last user is done; an operation that finds its file unlinked after
//    locking opens it again (the path may name a newer one by then). An empty table and a fresh
//    one (all zeros) are the same, so nothing is lost by that.
#pragma once

#include <sys/types.h>

#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>

namespace commlib {

// This process's identity for a table: its pid and start time (/proc/self/stat's 22nd field), so a
// reused pid is not mistaken for the process that held the entry.
struct ProcessId {
  int32_t pid = 0;
  uint64_t start = 0;
  bool operator==(const ProcessId& o) const { return pid == o.pid && start == o.start; }
};
ProcessId this_process();
// Whether `p` still runs (its start time unchanged); false for the empty id.
bool process_alive(const ProcessId& p);

// Runs `fn(table)` on the zero-initialised `bytes` of /dev/shm/`name`, locked as above; when `fn`
// returns true (the table is empty now), the file is unlinked before the lock is dropped.
// std::runtime_error naming the file when it cannot be opened or mapped.
void with_shared_ledger(const std::string& name, size_t bytes, const std::function<bool(void* table)>& fn);

// "commlib-<what>-<uid>-<device>" (characters other than letters, digits, '-' and '_' as '.'): the
// ledger of `what` for the physical device `device`, this user's.
std::string ledger_name(const std::string& what, const std::string& device);

// Whether /dev/shm/`name` exists (tests: nothing left behind).
bool shared_ledger_exists(const std::string& name);

}  // namespace commlib
