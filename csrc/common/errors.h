// Errors the engine and transports raise; the bindings map them to commlib.CommError / MismatchError /
// PeerError (MismatchError and PeerError derive from CommError in both languages).
#pragma once

#include <cstdint>
#include <stdexcept>
#include <string>

namespace commlib {

struct CommError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// Ranks called different collectives (or the same one with different arguments).
struct MismatchError : CommError {
  using CommError::CommError;
};

// A peer died, closed its communicator, aborted, or stayed silent past the timeout.
struct PeerError : CommError {
  using CommError::CommError;
};

// Kinds recorded in shared memory so peers can re-raise the same type.
enum class ErrorKind : uint32_t { None = 0, Comm = 1, Mismatch = 2, Peer = 3 };

// The kind of a CommError (its class); throw_kind is the way back.
inline ErrorKind kind_of(const CommError& e) {
  return dynamic_cast<const MismatchError*>(&e) ? ErrorKind::Mismatch
         : dynamic_cast<const PeerError*>(&e)   ? ErrorKind::Peer
                                                : ErrorKind::Comm;
}

[[noreturn]] inline void throw_kind(ErrorKind k, const std::string& msg) {
  switch (k) {
    case ErrorKind::Mismatch: throw MismatchError(msg);
    case ErrorKind::Peer: throw PeerError(msg);
    default: throw CommError(msg);
  }
}

}  // namespace commlib
