// A call's stream waiting for a buffer's own stream (a __cuda_array_interface__'s "stream"), the
// interface's rule, inside a graph capture too (bindings/device_own_stream.cc; docs/gpu.md
// "One call from Python").
#pragma once

#include "device/device.h"

namespace commlib {

// Makes `stream` (the call's) wait for the work enqueued so far on `own` (the buffer's), on device
// `d` (under the GIL: `shared`, the device's one wait event, is recorded and waited on by one call at
// a time), and returns `stream`'s capture status, asked here as the call's one capture query, which
// the caller hands to the engine (StreamEngine's known_capture) so it is not asked twice:
//  - `stream` not capturing, or `own` capturing too (the same capture: the wait joins it; another
//    capture: CUDA's cudaErrorStreamCaptureIsolation): `shared` recorded on `own`, `stream` waits on it;
//  - `stream` capturing and `own` not: CUDA refuses a plain wait on an event recorded outside the
//    capture, so the wait is an external event wait node (cudaEventWaitExternal) on an event made
//    for it, recorded on `own` now and held by the graph (a CUDA user object) for its life: every
//    launch of the graph waits for `own`'s work as of the capture, what the call consumed.
CaptureStatus wait_for_own_stream(Device& d, DeviceStream& own, DeviceStream& stream, DeviceEvent& shared);

}  // namespace commlib
