// Point-to-point messages on the stream engine (see stream_engine.h): send / recv / batches of
// them, and all_to_all with splits (a batch), on device buffers.
//
// A message moves like a schedule's message (chunks through the receiver's inbox, counters in the
// control regions), so point-to-point and collective messages of a pair share one chunk order.
// Messages carry no header, so each is described before it moves: the sender's stream writes
// (message number of the pair, count, dtype) into a ring in the receiver's control region, and the
// receiver's stream waits for that descriptor and compares it with its own receive before it takes
// a chunk; a different count or dtype fails the engine with MismatchError naming both. Messages to
// peers on the nccl link go through NCCL instead of the inbox (descriptors as above).
#include <algorithm>
#include <cstring>

#include "device/host_flags.h"
#include "engine/stream_engine.h"

namespace commlib {

namespace {

std::atomic<uint64_t>& seq_word(char* slot) { return *reinterpret_cast<std::atomic<uint64_t>*>(slot); }

}  // namespace

void StreamEngine::p2p_send_desc(int peer, const CallDesc& desc) {
  char* slot = p2p_slot(peers_[peer].ctl, rank_, desc.seq);
  std::memcpy(slot + 8, &desc, sizeof desc);
  store_flag(reinterpret_cast<uint64_t*>(slot), desc.seq);
}

void StreamEngine::p2p_check_desc(int peer, const CallDesc& desc) {
  char* slot = p2p_slot(ctl_, peer, desc.seq);
  // A sender that never sends is the watchdog's to judge: it sets give_up_ and this returns.
  if (!wait_flag(reinterpret_cast<const uint64_t*>(slot), desc.seq, &give_up_)) return;
  const uint64_t s = seq_word(slot).load(std::memory_order_acquire);
  CallDesc sent;
  std::memcpy(&sent, slot + 8, sizeof sent);
  const std::string me = std::to_string(rank_), them = std::to_string(peer);
  if (s != desc.seq)  // cannot happen while both ranks follow the protocol (the ring outruns the slots)
    fail(ErrorKind::Mismatch, "rank " + me + " expects message #" + std::to_string(desc.seq) + " from rank " + them +
                                  " but rank " + them + " is already at its message #" + std::to_string(s));
  else if (sent != desc)
    fail(ErrorKind::Mismatch, "rank " + me + " receives " + describe_call(desc) + " from rank " + them + " but rank " +
                                  them + " sent " + describe_call(sent));
}

std::shared_ptr<DeviceWork> StreamEngine::p2p(const std::vector<P2PItem>& items, DType dtype, DeviceStream& s) {
  std::lock_guard<std::mutex> guard(enqueue_mu_);
  throw_if_failed_locked();
  // An empty batch (all_to_all with splits on one rank) still orders and completes like a call.
  for (size_t i = 0; i < items.size(); ++i) {
    const P2PItem& it = items[i];
    if (it.peer < 0 || it.peer >= size_ || it.peer == rank_)
      throw std::invalid_argument("peer: " + std::to_string(it.peer) + " is not another rank of this communicator (size " +
                                  std::to_string(size_) + ")");
    if (it.count < 0) throw std::invalid_argument("count: negative");
    for (size_t j = 0; j < i; ++j)
      if (items[j].peer == it.peer && items[j].send == it.send)
        throw std::invalid_argument("ops: a second " + std::string(it.send ? "send to" : "receive from") + " rank " +
                                    std::to_string(it.peer) + " in one batch");
  }
  CallDesc call;  // the batch, for error messages; each message has its own descriptor
  call.coll = static_cast<uint8_t>(Collective::Send);
  call.dtype = static_cast<uint8_t>(dtype);
  call.algo = kDeviceCallAlgoBit;
  for (const P2PItem& it : items) call.count += it.count;
  for (const P2PItem& it : items) {
    const PeerStatus st = control_->peer_status(it.peer, false);
    if (st.state == PeerState::Failed) {
      const std::string msg = "rank " + std::to_string(rank_) + " cannot " + (it.send ? "send to" : "receive from") +
                              " rank " + std::to_string(it.peer) + ", which failed earlier: " + st.message;
      const ErrorKind kind = st.kind == ErrorKind::None ? ErrorKind::Comm : st.kind;
      fail(kind, msg);
      throw_kind(kind, msg);
    }
  }

  auto done = begin(call, s);
  std::vector<CallDesc> descs(items.size(), call);
  for (size_t i = 0; i < items.size(); ++i) {
    descs[i].count = items[i].count;
    descs[i].seq = items[i].send ? ++p2p_sent_[items[i].peer] : ++p2p_received_[items[i].peer];
  }
  // Every send's descriptor before any receive's check: a check waits only on peers' sends.
  // Peers on other hosts get theirs over NCCL, in one group (stream_remote.cc).
  std::vector<std::pair<int, CallDesc>> remote_sends, remote_expects;
  for (size_t i = 0; i < items.size(); ++i) {
    const int p = items[i].peer;
    if (remote(p))
      (items[i].send ? remote_sends : remote_expects).emplace_back(p, descs[i]);
    else if (items[i].send)
      device_->host_func([this, p, d = descs[i]] { p2p_send_desc(p, d); }, s);
  }
  std::string enqueue_error;
  try {
    exchange_remote(remote_sends, remote_expects, s);
    for (size_t i = 0; i < items.size(); ++i)
      if (!items[i].send && !remote(items[i].peer))
        device_->host_func([this, p = items[i].peer, d = descs[i]] { p2p_check_desc(p, d); }, s);
    const size_t esize = dtype_size(dtype);
    const size_t chunk = std::max<size_t>(opts_.slot_bytes / esize * esize, esize);
    auto chunks = [&](size_t bytes) { return bytes ? (bytes + chunk - 1) / chunk : 1; };
    // Messages to peers over the nccl link: one NCCL group, before the peer-memory chunks.
    if (nccl_->carries_any()) nccl_->enqueue_p2p(items, dtype, s);
    size_t rounds = 0;
    for (const P2PItem& it : items)
      if (!nccl_->carries(it.peer)) rounds = std::max(rounds, chunks(static_cast<size_t>(it.count) * esize));
    // Chunk i of every send before chunk i of every receive, as in a schedule step (no deadlock).
    for (size_t i = 0; i < rounds; ++i) {
      for (int pass = 0; pass < 2; ++pass) {
        for (const P2PItem& it : items) {
          if (it.send != (pass == 0) || nccl_->carries(it.peer)) continue;
          const size_t bytes = static_cast<size_t>(it.count) * esize;
          if (i >= chunks(bytes)) continue;
          const size_t off = i * chunk, n = std::min(chunk, bytes - std::min(bytes, off));
          char* p = reinterpret_cast<char*>(it.ptr) + (bytes ? off : 0);
          if (it.send)
            send_chunk(it.peer, p, n, seq_, s);
          else
            recv_chunk(it.peer, p, nullptr, n, false, dtype, RedOp::Sum, seq_, s);
        }
      }
    }
  } catch (const std::exception& e) {
    enqueue_error = "rank " + std::to_string(rank_) + " could not enqueue a batch of " + std::to_string(items.size()) +
                    " sends/receives: " + e.what();
    fail(ErrorKind::Comm, enqueue_error);
  }
  return finish(done, enqueue_error, s);
}

}  // namespace commlib
