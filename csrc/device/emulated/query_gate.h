// A test hook of the emulated device: hold event queries made by other threads than the one that
// closed the gate (the watchdog's, while the caller's thread enqueues), to prove structurally that
// a call's enqueue never waits behind another thread's query (tests/stream/test_call_structure.py).
#pragma once

namespace commlib {

// close: queries from other threads wait (each at most 5 s: never a hang) until the gate opens.
void hold_other_threads_queries(bool close);
// Queries waiting at the gate now.
int queries_held_at_gate();
// Called by EmulatedDevice::query before it reads the event.
void pass_query_gate();

}  // namespace commlib
