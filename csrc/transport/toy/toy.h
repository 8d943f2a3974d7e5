// A toy kind of transport, for tests only: the proof that the transport table is open, i.e. that
// a kind is a folder and a row, with no edit to the table, the Fabric or the executor
// (tests/transport/test_toy_transport.py). "toy" carries the pairs that the shm row can connect,
// by wrapping the domain that row builds (reached through the table by name: this folder includes
// no other kind), with a domain and links of its own classes; its links count the chunks they
// publish. Unlike shm and tcp it registers only when a test asks (`_C.toy_transport(True)`), ahead
// of shm, and withdraws when asked, so a process's other communicators never see it.
#pragma once

#include <cstdint>

namespace commlib {
namespace toy {

// Registers "toy" ahead of every other kind (on) or withdraws it (off); idempotent.
void set_registered(bool on);
// Chunks this process's toy links published, since it started.
uint64_t chunks_published();
// Every other acquire_send (peek_recv) of each toy link finds the link full (empty): a step's next
// message to (from) the same peer then asks the link while the earlier one is part way, as a
// sender stalled on a full channel or a receiver ahead of its data would (tests: the executor's
// order of a pair's messages in one step).
void set_stutter(bool on);

}  // namespace toy
}  // namespace commlib
