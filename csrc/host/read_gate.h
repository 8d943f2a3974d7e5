// A test seam: hold this process's next single-copy read of one peer between the peer's
// publication of its buffer (the rendezvous chunk has arrived) and the read itself, until the test
// lets it go. A test then changes the world in that window deterministically (another rank dies,
// the sender's call fails and its buffer goes away) instead of hoping a timing race lands there
// (tests/host/test_single_copy_gate.py). Unarmed, the executor pays one relaxed atomic load per
// rendezvous message.
#pragma once

#include <string>

namespace commlib {

// Arms the gate: the next single-copy read of `peer` (its rank in the reading communicator) in this
// process creates the file `path`, then waits until that file no longer exists (polled every
// millisecond, at most `max_wait_s` seconds, then reads anyway), then disarms. Rearming replaces.
void arm_read_gate(int peer, const std::string& path, double max_wait_s);

// Called by the executor before it reads `peer`'s buffer; returns at once unless armed for it.
void pass_read_gate(int peer);

}  // namespace commlib
