// The point-to-point path (p2p_path.h).
#include "stream/p2p_path.h"

#include <algorithm>
#include <stdexcept>
#include <utility>
#include <vector>

namespace commlib {

P2PPath::P2PPath(Device& device, CopyPath& copy, NcclLink& nccl, P2PDescriptors& descs, RemoteDescriptors& remote,
                 CopyPathHost& host, uint64_t slot_bytes)
    : device_(device), copy_(copy), nccl_(nccl), descs_(descs), remote_(remote), host_(host), slot_bytes_(slot_bytes) {}

const ResolvedPlan& P2PPath::no_plan() {
  static const ResolvedPlan none;
  return none;
}

Launched P2PPath::enqueue(const PathCall& pc, DeviceStream& s) {
  if (!pc.batch) throw std::invalid_argument("the point-to-point path takes batches of messages only");
  const std::vector<P2PItem>& items = pc.batch->items;
  const std::vector<CallDesc>& descs = pc.batch->descs;
  const std::vector<uint64_t>& ring = pc.batch->ring;
  const DType dtype = pc.batch->dtype;
  const uint64_t seq = pc.seq;
  P2PDescriptors* described = &descs_;  // what the host functions below reach (the engine owns it)
  // Every send's descriptor before any receive's check: a check waits only on peers' sends.
  // Peers on other hosts get theirs over NCCL, in one group (remote_descriptors.h).
  std::vector<std::pair<int, CallDesc>> remote_sends, remote_expects;
  for (size_t i = 0; i < items.size(); ++i) {
    const int p = items[i].peer;
    if (copy_.remote(p))
      (items[i].send ? remote_sends : remote_expects).emplace_back(p, descs[i]);
    else if (items[i].send)
      device_.host_func([described, p, k = ring[i], d = descs[i]] { described->send(p, k, d); }, s);
  }
  remote_.exchange(remote_sends, remote_expects, seq, s);
  for (size_t i = 0; i < items.size(); ++i) {
    if (items[i].send || copy_.remote(items[i].peer)) continue;
    // The descriptor's arrival is a wait on the device (never a host function that waits);
    // the watchdog meanwhile looks for a host message of this number (P2PDescriptors::note_waits).
    const int p = items[i].peer;
    uint64_t* word = reinterpret_cast<uint64_t*>(copy_.p2p_slot(p, ring[i]));
    descs_.note_waits({{p, descs[i]}}, true);
    host_.note_wait(StreamWait{word, ring[i], p, false, seq, WaitFor::MessageDesc});
    device_.wait_value(reinterpret_cast<uint64_t*>(copy_.p2p_slot(p, ring[i], true)), ring[i], s);
    device_.host_func([described, p, k = ring[i], d = descs[i], seq] { described->check(p, k, d, seq); }, s);
  }
  const size_t esize = dtype_size(dtype);
  const size_t chunk = std::max<size_t>(slot_bytes_ / esize * esize, esize);  // the copy path's chunks
  auto chunks = [&](size_t bytes) { return bytes ? (bytes + chunk - 1) / chunk : 1; };
  // Messages to peers over the nccl link: one NCCL group, before the peer-memory chunks.
  if (nccl_.carries_any()) nccl_.enqueue_p2p(items, dtype, s);
  size_t rounds = 0;
  for (const P2PItem& it : items)
    if (!copy_.grouped(it.peer)) rounds = std::max(rounds, chunks(static_cast<size_t>(it.count) * esize));
  // Chunk i of every send before chunk i of every receive, as in a schedule step (no deadlock).
  for (size_t i = 0; i < rounds; ++i) {
    for (int pass = 0; pass < 2; ++pass) {
      for (const P2PItem& it : items) {
        if (it.send != (pass == 0) || copy_.grouped(it.peer)) continue;
        const size_t bytes = static_cast<size_t>(it.count) * esize;
        if (i >= chunks(bytes)) continue;
        const size_t off = i * chunk, n = std::min(chunk, bytes - std::min(bytes, off));
        char* p = reinterpret_cast<char*>(it.ptr) + (bytes ? off : 0);
        if (it.send)
          copy_.send_chunk(it.peer, p, n, seq, s);
        else
          copy_.recv_chunk(it.peer, p, nullptr, n, false, dtype, RedOp::Sum, seq, s);
      }
    }
  }
  return Launched{};  // the copy path's chunks: an event
}

}  // namespace commlib
