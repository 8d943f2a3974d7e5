// The stream engine's control plane (stream/stream_engine.h PeerControl) over a host communicator:
// wiring between two engines, so it lives in the bindings, which see both.
#pragma once

#include <memory>

#include "host/communicator.h"
#include "stream/stream_engine.h"

namespace commlib {

// Over a communicator (which must outlive the engine).
std::unique_ptr<PeerControl> communicator_peer_control(Communicator& comm);

}  // namespace commlib
