// Owners that carry a transport from the bootstrap (Python) into a Communicator's Fabric.
#pragma once

#include <memory>

#include "transport/tcp/tcp.h"

namespace commlib {

struct TcpEndpoint {
  std::unique_ptr<TcpTransport> transport;  // moved into the communicator's Fabric
};

}  // namespace commlib
