// The receiving side of a single-copy message (executor.h): the sender published its buffer's
// address in a rendezvous chunk; this rank reads the message straight out of the sender's memory
// (Link::read_peer, process_vm_readv on shared memory) and the executor then acknowledges it.
#include <algorithm>
#include <cstring>
#include <string>

#include "host/executor.h"
#include "host/read_gate.h"
#include "kernels/cpu_reduce.h"
#include "plan/describe.h"

namespace commlib {

void Executor::receive_rendezvous(ExecOp& o, const char* payload, DType dtype, RedOp op, const CallDesc& call,
                                  char* into) {
  uint64_t address;
  std::memcpy(&address, payload, sizeof(address));
  Link& l = t_.link(o.peer);
  pass_read_gate(o.peer);  // a test seam (host/read_gate.h): returns at once unless a test armed it
  // The sender waits for our acknowledgement and does not touch its buffer meanwhile, so a failed
  // read means it died (or its memory went away): a PeerError naming it and the call, published
  // so every rank stops, never a crash of this reader.
  try {
    if (into)
      l.read_peer(into, address, o.bytes);  // parked (executor_lanes.cc): as it is, landed when its step runs
    else
      read_from_peer(o, l, address, dtype, op);
  } catch (const PeerError& e) {
    // A sender whose call failed (another peer died) stops waiting for our acknowledgement and its
    // buffer may go away: then the failed read echoes that failure, which names the rank that died.
    std::string why = e.what();
    for (int p = 0; p < t_.size(); ++p) {
      if (p == t_.rank() || !t_.peer_failed(p)) continue;
      why += "; rank " + std::to_string(p) + " failed first: " + t_.peer_status(p, false).message;
      break;
    }
    fail(ErrorKind::Peer, t_.describe_peer(o.peer) + " could not be read during " + describe_call(call) + " (rank " +
                              std::to_string(t_.rank()) + "): " + why);
  }
}

void Executor::read_from_peer(ExecOp& o, Link& l, uint64_t address, DType dtype, RedOp op) {
  if (o.kind == OpKind::Recv) {
    l.read_peer(o.dst, address, o.bytes);  // the one copy: sender's buffer -> ours
  } else {
    // Read a cache-sized piece, reduce it while it is hot, repeat.
    const size_t esize = dtype_size(dtype);
    const size_t piece = std::max<size_t>(esize, (256 << 10) / esize * esize);
    if (bounce_.size() < piece) bounce_.resize(piece);
    for (size_t off = 0; off < o.bytes; off += piece) {
      size_t n = std::min(piece, o.bytes - off);
      l.read_peer(bounce_.data(), address + off, n);
      if (o.src && o.src != o.dst) std::memcpy(o.dst + off, o.src + off, n);
      reduce_inplace(o.dst + off, bounce_.data(), n / esize, dtype, op);
    }
  }
}

}  // namespace commlib
