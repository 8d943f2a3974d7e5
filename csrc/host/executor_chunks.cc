// A received chunk, judged and delivered (executor.h): its flags, whether it is the chunk of the
// message a receive expects (call, lane, offset, length), and its bytes written to the receive's
// destination. Shared by run_step's receives and a laned call's (executor_lanes.cc).
#include <cstring>
#include <string>

#include "host/executor.h"
#include "kernels/cpu_copy.h"
#include "kernels/cpu_reduce.h"
#include "plan/describe.h"

namespace commlib {

void Executor::check_chunk(const ExecOp& o, const ChunkHeader* h, size_t at, size_t expect, const CallDesc& call,
                           const std::vector<ExecOp>& ops) {
  if (h->desc == o.desc && h->offset == at && h->bytes == expect && h->lane == o.lane) return;
  std::string got = describe_call(h->desc);
  std::string msg = "rank " + std::to_string(t_.rank()) + " in " + describe_call(call) + " received from rank " +
                    std::to_string(o.peer) + " a message of " + got + "; expected " + describe_call(o.desc) +
                    codec_mismatch_hint(o.desc, h->desc);
  if (h->desc == o.desc && h->lane != o.lane)
    msg += " (a message of schedule lane " + std::to_string(h->lane) + ", expected lane " + std::to_string(o.lane) + ")";
  else if (h->desc == o.desc)
    msg += " (chunk at byte " + std::to_string(h->offset) + " of " + std::to_string(h->bytes) + " bytes, expected byte " +
           std::to_string(at) + " of " + std::to_string(expect) + ")";
  check_device_messages(ops);  // the message came on a device buffer: say so
  fail(ErrorKind::Mismatch, msg);
}

// Peers are not trusted: a rendezvous chunk makes us read the sender's memory at an address it
// chose, so accept one only when this rank turned single-copy reads on; unknown flag bits mean a
// corrupt header.
void Executor::check_flags(const ChunkHeader* h, const Link& l, bool landed, int peer, const CallDesc& call) {
  const bool rendezvous = h->flags & kChunkRendezvous;
  if ((h->flags & ~(kChunkRendezvous | (landed ? kChunkLanded : 0u))) || (rendezvous && !l.caps().accepts_rendezvous))
    fail(ErrorKind::Comm, "rank " + std::to_string(t_.rank()) + " in " + describe_call(call) + " received from rank " +
                              std::to_string(peer) + " a chunk with invalid flags " + std::to_string(h->flags));
}

void Executor::deliver_bytes(ExecOp& o, size_t at, const char* payload, size_t n, DType dtype, RedOp op) {
  if (o.kind == OpKind::Recv) {
    copy_bytes(o.dst + at, payload, n, streams(o.bytes));
  } else {
    // recv_reduce from another buffer: bring this piece of it into dst first, so the copy and the
    // reduce both touch it while it is in cache.
    if (o.src && o.src != o.dst) std::memcpy(o.dst + at, o.src + at, n);
    reduce_inplace(o.dst + at, payload, n / dtype_size(dtype), dtype, op);
  }
}

}  // namespace commlib
