// The one lowering's per-call half, shared by every engine: the call's descriptor (what the peers
// compare), the private input copy premul_sum and in-place all_to_all need (read from the shapes
// table), avg's epilogue and the check that no peer failed before the call starts. The engines
// differ only in how they run a resolved plan (host/lowering.cc, stream/stream_calls.cc).
#pragma once

#include <cstdint>
#include <functional>
#include <string>

#include "plan/call.h"
#include "schedule/ir.h"
#include "transport/transport.h"

namespace commlib {

// The call's descriptor; `algo` the resolved 1-based index (a device call ORs kDeviceCallAlgoBit).
CallDesc call_desc(const CollectiveCall& call, uint8_t algo, uint64_t seq);

// What the engine stages before the schedule runs: premul_sum scales the input into a private copy
// (the schedule then runs in its out-of-place form); in-place all_to_all sends from a copy, since
// every block is both sent and overwritten; compress= (out of place) sends from a copy it projects
// (docs/compression.md). `elements` counts the copy.
struct InputStaging {
  enum Kind { None, Scale, Copy } kind = None;
  size_t elements = 0;
};
InputStaging input_staging(const CollectiveCall& call, int rank, int size);

// The address of `r` in a call's buffers (bases: input, output, scratch; schedule/ir.h
// region_start), for every engine: a region of a buffer this rank does not have is nullptr when
// empty, else a CommError naming the call, the rank and the buffer (an internal error: the
// schedule `algo`, "" unnamed, is wrong).
char* region_address(char* const* bases, const Region& r, size_t esize, const CallDesc& desc, int rank,
                     const std::string& algo = "");

// Whether this rank divides its output by the world size after the schedule (op avg).
bool avg_divides(const CollectiveCall& call, int rank);

// The first peer that failed earlier, as the error this call raises (false: none failed).
bool failed_peer_error(const CallDesc& desc, int rank, int size, const std::function<PeerStatus(int)>& status,
                       ErrorKind* kind, std::string* message);

}  // namespace commlib
