// Point-to-point messages on the stream engine (see stream_engine.h): send / recv / batches of
// them, and all_to_all with splits (a batch), on device buffers.
//
// A message moves like a schedule's message (chunks through the receiver's inbox, counters in the
// control regions), so point-to-point and collective messages of a pair share one chunk order.
// Messages carry no header, so each is described before it moves (stream/p2p_descriptors.h: the
// ring of descriptors in the receiver's control region, checked before a chunk is taken).
// Messages to peers on the nccl link go through NCCL instead of the inbox (descriptors as above).
#include <algorithm>

#include "stream/stream_engine.h"

namespace commlib {

std::shared_ptr<DeviceWork> StreamEngine::p2p(const std::vector<P2PItem>& items, DType dtype, DeviceStream& s) {
  std::lock_guard<std::mutex> guard(enqueue_mu_);
  throw_if_failed_locked();
  try {
    DeviceGuard current(*device_);
    if (device_->capture_status(s) != CaptureStatus::None)  // stream/stream_capture.cc
      throw CommError("rank " + std::to_string(rank_) + " cannot capture point-to-point messages in a CUDA graph: they "
                      "run on the copy path, which refuses capture");
    return enqueue_p2p(items, dtype, s);
  } catch (const CommError&) {
    throw;
  } catch (const std::invalid_argument&) {
    throw;
  } catch (const std::exception& e) {
    device_error("enqueueing point-to-point messages", e);
  }
}

std::shared_ptr<DeviceWork> StreamEngine::enqueue_p2p(const std::vector<P2PItem>& items, DType dtype, DeviceStream& s) {
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
      raise_to_caller(kind, msg);
    }
  }

  begin(call, s);
  std::vector<CallDesc> descs(items.size(), call);
  std::vector<uint64_t> ring(items.size());  // the pair's device message index
  for (size_t i = 0; i < items.size(); ++i) {
    descs[i].count = items[i].count;
    descs[i].seq = control_->next_p2p_seq(items[i].peer, items[i].send);
    ring[i] = p2p_descs_->next_index(items[i].peer, items[i].send);
  }
  // Every send's descriptor before any receive's check: a check waits only on peers' sends.
  // Peers on other hosts get theirs over NCCL, in one group (remote_descriptors.h).
  std::vector<std::pair<int, CallDesc>> remote_sends, remote_expects;
  for (size_t i = 0; i < items.size(); ++i) {
    const int p = items[i].peer;
    if (remote(p))
      (items[i].send ? remote_sends : remote_expects).emplace_back(p, descs[i]);
    else if (items[i].send)
      device_->host_func([this, p, k = ring[i], d = descs[i]] { p2p_descs_->send(p, k, d); }, s);
  }
  std::string enqueue_error;
  try {
    remote_descs_->exchange(remote_sends, remote_expects, seq_, s);
    for (size_t i = 0; i < items.size(); ++i) {
      if (items[i].send || remote(items[i].peer)) continue;
      // The descriptor's arrival is a wait on the device (never a host function that waits);
      // the watchdog meanwhile looks for a host message of this number (P2PDescriptors::note_waits).
      const int p = items[i].peer;
      uint64_t* word = reinterpret_cast<uint64_t*>(copy_->p2p_slot(p, ring[i]));
      p2p_descs_->note_waits({{p, descs[i]}}, true);
      note_wait(StreamWait{word, ring[i], p, false, seq_, WaitFor::MessageDesc});
      device_->wait_value(reinterpret_cast<uint64_t*>(copy_->p2p_slot(p, ring[i], true)), ring[i], s);
      device_->host_func([this, p, k = ring[i], d = descs[i], call = seq_] { p2p_descs_->check(p, k, d, call); }, s);
    }
    const size_t esize = dtype_size(dtype);
    const size_t chunk = std::max<size_t>(opts_.slot_bytes / esize * esize, esize);  // the copy path's chunks
    auto chunks = [&](size_t bytes) { return bytes ? (bytes + chunk - 1) / chunk : 1; };
    // Messages to peers over the nccl link: one NCCL group, before the peer-memory chunks.
    if (nccl_->carries_any()) nccl_->enqueue_p2p(items, dtype, s);
    size_t rounds = 0;
    for (const P2PItem& it : items)
      if (!grouped(it.peer)) rounds = std::max(rounds, chunks(static_cast<size_t>(it.count) * esize));
    // Chunk i of every send before chunk i of every receive, as in a schedule step (no deadlock).
    for (size_t i = 0; i < rounds; ++i) {
      for (int pass = 0; pass < 2; ++pass) {
        for (const P2PItem& it : items) {
          if (it.send != (pass == 0) || grouped(it.peer)) continue;
          const size_t bytes = static_cast<size_t>(it.count) * esize;
          if (i >= chunks(bytes)) continue;
          const size_t off = i * chunk, n = std::min(chunk, bytes - std::min(bytes, off));
          char* p = reinterpret_cast<char*>(it.ptr) + (bytes ? off : 0);
          if (it.send)
            copy_->send_chunk(it.peer, p, n, seq_, s);
          else
            copy_->recv_chunk(it.peer, p, nullptr, n, false, dtype, RedOp::Sum, seq_, s);
        }
      }
    }
  } catch (const std::exception& e) {
    enqueue_error = "rank " + std::to_string(rank_) + " could not enqueue a batch of " + std::to_string(items.size()) +
                    " sends/receives: " + e.what();
    fail_as(ErrorKind::Comm, ErrorKind::Peer, enqueue_error, true);  // PeerError at the peers (stream_calls.cc)
  }
  std::shared_ptr<DeviceWork> work;
  finish(Launched{}, enqueue_error, s, &work);  // the copy path's chunks: an event
  return work;
}

void StreamEngine::note_p2p_waits(const std::vector<std::pair<int, CallDesc>>& waits, bool add) {
  p2p_descs_->note_waits(waits, add);
}

void StreamEngine::check_host_messages() {
  std::string message;
  if (p2p_descs_->host_message_mismatch(&message)) fail(ErrorKind::Mismatch, message);
}

void StreamEngine::check_first_p2p(const std::vector<P2PItem>& items, DType dtype) {
  std::string message;
  if (!p2p_descs_->first_call_mismatch(items, dtype, &message)) return;
  fail(ErrorKind::Mismatch, message);
  raise_to_caller(ErrorKind::Mismatch, message);
}

}  // namespace commlib
