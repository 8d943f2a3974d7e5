// The stream engine's set-up on one (communicator, device), in C++ (issues #44, #37): the engine
// made, its handle published, every rank's handle awaited, the device link setting agreed, the
// engine connected. One implementation for every caller: the Python device route
// (commlib/core/device_route.py `_engine`, through device_engine_setup_bindings.cc) and C++
// callers. What stays with the caller: NCCL's communicator (commlib/device/nccl_comm.py
// `setup_links`, when needs_nccl()), whose library candidates and unique id are Python's.
//
// The rendezvous goes through a SetupStore (the communicator's store: commlib's TCPStore or the
// store torch gave the group), not the core's transport: the transport's control plane carries
// fixed words (state, failure, published call), and its links carry numbered call messages, so
// an exchange there would take a call number of the one numbering host and device calls share and
// a peer in a host call would meet the exchange, not the device call (docs/torch_backend.md, "What
// stays on the Python path").
//
// While it waits for rank r's handle, every round: `poll` (the first call's descriptor check:
// MismatchError when a peer is in a host call of that number), the store's error key (a rank whose
// set-up failed published "rank N: Class: message" there: the same class for PeerError and
// MismatchError, else CommError "stream engine set-up failed: ..."), every 0.1 s whether rank r is
// gone (PeerError naming `what`), then the timeout (CommError naming rank r). Any failure is
// published under the error key before it is thrown, so every rank stops waiting.
#pragma once

#include <functional>
#include <memory>
#include <string>

#include "bindings/setup_store.h"
#include "device/device.h"
#include "host/communicator.h"
#include "stream/stream_engine.h"

namespace commlib {

struct DeviceEngineSetup {
  Communicator& comm;
  std::shared_ptr<Device> device;
  double timeout_s;
  std::string label;   // the communicator's store prefix (the engine's label)
  std::string prefix;  // the keys of this set-up: "<label>/device<n>"
  // While the ranks meet (may throw): the first call's descriptor check, or the engine's failure.
  std::function<void(StreamEngine&)> poll;
  std::string what;  // the call that sets the engine up, named in a gone peer's PeerError
};

// The connected engine; throws (after publishing the failure under "<prefix>/error").
std::shared_ptr<StreamEngine> set_up_device_engine(const DeviceEngineSetup& s, SetupStore& store);

// "rank N: Class: message" for an error this rank publishes (bootstrap/wait.py `report`), and the
// error a rank raises for such a report (`reported_failure`): thrown here.
std::string setup_failure_report(int rank, const std::exception& e);
[[noreturn]] void throw_reported_setup_failure(const std::string& why, int rank);

}  // namespace commlib
