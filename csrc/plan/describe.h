// Lives in plan/, not common/: it names algorithms, which only the schedule registry knows.
// Human-readable text for a call descriptor, e.g. "all_reduce #5 (ring, 1000 x float32, sum)".
//
// Descriptors are read from peers' chunk headers and control blocks in shared memory, so every
// code in them is untrusted: each is range-checked before it indexes a name table, and an unknown
// code is shown as a number ("collective code 200") instead of whatever memory lies past the table.
#pragma once

#include <string>

#include "transport/transport.h"

namespace commlib {

std::string describe_call(const CallDesc& d);

// The mismatch error every engine raises when rank `me`'s call `mine` meets rank `peer`'s `theirs`:
// "rank A called X but rank B called Y" for the same call number; when the numbers differ,
// "rank A is at X but rank B is already at Y (the calls between them differ)".
std::string mismatch_message(int me, const CallDesc& mine, int peer, const CallDesc& theirs);

// " (the ranks passed different compress=)" when the same call differs in its codec, else "".
std::string codec_mismatch_hint(const CallDesc& mine, const CallDesc& theirs);

// Set in CallDesc::algo for calls on device buffers (the stream engine): host and device calls
// share one numbering (host/communicator.h) and one published-call slot, and a host call and a device
// call of the same number then differ, which is a mismatch. Algorithm indexes stay below it.
constexpr uint8_t kDeviceCallAlgoBit = 0x80;

// CollectiveCall::algo / CallDesc::algo of algorithm="nccl": above every registry index (they
// start at 1), below 0x80 (the high bit may mark device calls in descriptors).
constexpr uint8_t kNcclAlgorithmCode = 0x7F;

// CallDesc::algo of a host call auto ran through the shared-memory flags (host/lowering.cc
// flag_route) instead of its schedule: described as "flags".
// (describe.cc checks that the registry's indices, kMaxAlgorithmsPerCollective, stay below both.)
constexpr uint8_t kFlagCallAlgorithmCode = 0x7E;

}  // namespace commlib
