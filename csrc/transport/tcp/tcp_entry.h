// The tcp kind's material for the transport table (transport/registry.h): the listening endpoint.
#pragma once

#include <memory>
#include <vector>

#include "transport/registry.h"
#include "transport/tcp/tcp.h"

namespace commlib {

constexpr const char* kTcpKind = "tcp";

// A rank's listening endpoint (the bootstrap published its address), handed to the table under
// kTcpKind; the tcp domain takes it. `reaches` by rank: whether the endpoint reaches that rank
// (the endpoint's own answer; set alone, without an endpoint, by the table's unit tests).
struct TcpEndpointMaterial : TransportMaterial {
  explicit TcpEndpointMaterial(std::unique_ptr<TcpTransport> ep) : endpoint(std::move(ep)) {
    for (int r = 0; endpoint && r < endpoint->size(); ++r) reaches.push_back(endpoint->reaches(r));
  }
  std::unique_ptr<TcpTransport> endpoint;
  std::vector<bool> reaches;
};

}  // namespace commlib
