// The executor's look, before a call starts, for a peer that failed earlier (it then raises at
// once, naming that peer and the call, rather than waiting for it). Every call asks, and a peer has
// almost never failed: the look is the transport's cheap one (a load of the peer's state word on
// shared memory); the message is built only when one has.
#include "host/executor.h"
#include "plan/lowering.h"

namespace commlib {

void Executor::check_peers_failed(const CallDesc& call) {
  bool any = false;
  for (int p = 0; p < t_.size() && !any; ++p) any = p != t_.rank() && t_.peer_failed(p);
  if (!any) return;
  ErrorKind kind;
  std::string message;
  if (failed_peer_error(call, t_.rank(), t_.size(), [this](int p) { return t_.peer_status(p, false); }, &kind, &message))
    fail(kind, message);
}

}  // namespace commlib
