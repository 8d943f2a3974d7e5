// When a message between ranks of one host goes single-copy (the receiver reads the sender's buffer
// with process_vm_readv, csrc/transport/shm/shm_direct.cc) instead of through the channel's chunks
// (two copies, the chunks staying in cache between them). Which is faster depends on the machine, the
// collective, the world size and the call's size, so it is measured, not fixed: `commlib tune`
// compares runs of the bench with COMMLIB_CMA=0 and with it on (1, or a smallest message such as 32K)
// and writes, per collective and world size, the call size from which single-copy reads won and the
// smallest message that then goes single-copy (the tuning file's "single_copy" section,
// commlib/core/tuning.py). Without an entry a call stays on the channels.
//
// COMMLIB_CMA (read once per communicator): auto (default) = the tuning file's crossover; 0 = never
// (no probe either); 1 = every message of kSingleCopyMinMessage bytes or more; N (bytes, 2 or more,
// K/M/G suffixes) = every message of N bytes or more (tests force tiny messages through it).
#pragma once

#include <cstdint>
#include <map>
#include <string>

#include "common/types.h"

namespace commlib {

// Below this a message's rendezvous round trip (publish the address, wait for the peer's read and
// its acknowledgement) costs more than the second copy it saves: COMMLIB_CMA=1's smallest message,
// and a tuning entry's when it names none. Measured on the AMD machines; on the Intel Xeon ones a
// 32 KiB message already gains (bench/RESULTS_collectives.md, session 35), so an entry carries its own.
constexpr int64_t kSingleCopyMinMessage = int64_t{64} << 10;
constexpr int64_t kSingleCopyNever = -1;

// One tuning entry (collective, world size): calls of `min_call_bytes` or more (auto's meaning:
// per-rank count x element size; kSingleCopyNever: none) send their messages of `min_message` bytes
// or more single-copy.
struct SingleCopyCrossover {
  int64_t min_call_bytes = kSingleCopyNever;
  int64_t min_message = kSingleCopyMinMessage;
};

struct SingleCopySetting {
  enum Mode : uint8_t { Auto, Off, On, Bytes } mode = Auto;
  int64_t min_message = kSingleCopyMinMessage;  // On / Bytes: the smallest message sent single-copy
};

// Parses COMMLIB_CMA; std::invalid_argument naming it when malformed.
SingleCopySetting single_copy_setting();
SingleCopySetting parse_single_copy(const std::string& value);

// The tuning file's crossovers of collective c: {world size: its entry}. Thread-safe; an entry's
// min_call_bytes must be -1 or more and its min_message 2 or more (std::invalid_argument). A change
// bumps the tuning generation (policy/auto_policy.h), as a new tuning table does: every
// communicator then drops its plans, and each plan reads its call's answer once
// (single_copy_auto_min) when it is built. So a call reads no table and takes no lock, and a table
// replaced while calls run is seen from the next call on (tests/host/test_single_copy_reload.py).
void set_single_copy_crossovers(Collective c, std::map<int, SingleCopyCrossover> entries);
void clear_single_copy_crossovers();
// The entry of (c, size), or one that never goes single-copy (under the table's lock).
SingleCopyCrossover single_copy_crossover(Collective c, int size);
// What COMMLIB_CMA=auto gives a call of `call_bytes` under entry `x` (single_copy_crossover): the
// entry's smallest message when the tuning says single-copy from that size, else kSingleCopyNever.
inline int64_t single_copy_auto_min(const SingleCopyCrossover& x, int64_t call_bytes) {
  return (x.min_call_bytes >= 0 && call_bytes >= x.min_call_bytes) ? x.min_message : kSingleCopyNever;
}
// The same for (c, size), reading the table now (under its lock).
int64_t single_copy_auto_min(Collective c, int64_t call_bytes, int size);

// For one call: the smallest message of the call to send single-copy, or kSingleCopyNever, from the
// setting and what auto would give the call (single_copy_auto_min, read once per plan). No lock.
inline int64_t single_copy_min_message(const SingleCopySetting& s, int64_t auto_min) {
  switch (s.mode) {
    case SingleCopySetting::Off: return kSingleCopyNever;
    case SingleCopySetting::On:
    case SingleCopySetting::Bytes: return s.min_message;
    case SingleCopySetting::Auto: break;
  }
  return auto_min;
}
// The same, reading the table now (under its lock): for callers without a plan (the bindings).
int64_t single_copy_min_message(const SingleCopySetting& s, Collective c, int64_t call_bytes, int size);

}  // namespace commlib
