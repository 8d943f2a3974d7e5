// The stream engine's control plane (stream/peer_control.h) over a host communicator:
// wiring between two engines, so it lives in the bindings, which see both.
#pragma once

#include <memory>

#include "host/communicator.h"
#include "stream/peer_control.h"

namespace commlib {

// Over a communicator. The engine may outlive it (its works hold it): it closes when the
// communicator does (a close listener), before the transport goes, and never calls it after.
std::unique_ptr<PeerControl> communicator_peer_control(Communicator& comm);

}  // namespace commlib
