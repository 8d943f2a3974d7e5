// Lives in the engine, not common/: it names algorithms, which only the schedule registry knows.
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

}  // namespace commlib
