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
#include "stream/stream_engine.h"

namespace commlib {

namespace {

std::atomic<uint64_t>& seq_word(char* slot) { return *reinterpret_cast<std::atomic<uint64_t>*>(slot); }

}  // namespace

void StreamEngine::p2p_send_desc(int peer, uint64_t k, const CallDesc& desc) {
  char* slot = copy_->peer_p2p_slot(peer, k);
  std::memcpy(slot + 8, &desc, sizeof desc);
  store_flag(reinterpret_cast<uint64_t*>(slot), k);
}

void StreamEngine::note_p2p_waits(const std::vector<std::pair<int, CallDesc>>& waits, bool add) {
  std::lock_guard<std::mutex> lk(mu_);
  for (const auto& w : waits) {
    if (w.second.coll != static_cast<uint8_t>(Collective::Send)) continue;
    if (add) {
      p2p_waits_.push_back(w);
      continue;
    }
    for (auto it = p2p_waits_.begin(); it != p2p_waits_.end(); ++it)
      if (it->first == w.first && it->second == w.second) {
        p2p_waits_.erase(it);
        break;
      }
  }
}

void StreamEngine::p2p_check_desc(int peer, uint64_t k, const CallDesc& desc, uint64_t call) {
  // Runs after the stream's wait_value on the slot's word: the descriptor is there (or the wait
  // was released by a failure). Only reads and compares: a mismatch is recorded for the watchdog,
  // with the engine's number of the call (`call`): the stream goes on and may complete the call
  // before the watchdog fails the engine, and the call must raise the error all the same.
  note_p2p_waits({{peer, desc}}, false);
  const char* slot = copy_->p2p_slot(peer, k);
  const uint64_t s = seq_word(const_cast<char*>(slot)).load(std::memory_order_acquire);
  if (failed() || s < k) return;
  CallDesc sent;
  std::memcpy(&sent, slot + 8, sizeof sent);
  const std::string me = std::to_string(rank_), them = std::to_string(peer);
  if (s != k || sent != desc) copy_->stop_data();  // the receive's chunks skip: nothing lands in its buffer
  if (s != k)  // cannot happen while both ranks follow the protocol (the ring outruns the slots)
    fail_from_stream(ErrorKind::Mismatch, "rank " + me + " expects device message #" + std::to_string(k) + " from rank " +
                                              them + " but rank " + them + " is already at its device message #" +
                                              std::to_string(s),
                     call);
  else if (sent != desc)
    fail_from_stream(ErrorKind::Mismatch, "rank " + me + " receives " + describe_call(desc) + " from rank " + them +
                                              " but rank " + them + " sent " + describe_call(sent),
                     call);
}

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
    ring[i] = items[i].send ? ++p2p_sent_[items[i].peer] : ++p2p_received_[items[i].peer];
  }
  // Every send's descriptor before any receive's check: a check waits only on peers' sends.
  // Peers on other hosts get theirs over NCCL, in one group (stream_remote.cc).
  std::vector<std::pair<int, CallDesc>> remote_sends, remote_expects;
  for (size_t i = 0; i < items.size(); ++i) {
    const int p = items[i].peer;
    if (remote(p))
      (items[i].send ? remote_sends : remote_expects).emplace_back(p, descs[i]);
    else if (items[i].send)
      device_->host_func([this, p, k = ring[i], d = descs[i]] { p2p_send_desc(p, k, d); }, s);
  }
  std::string enqueue_error;
  try {
    exchange_remote(remote_sends, remote_expects, s);
    for (size_t i = 0; i < items.size(); ++i) {
      if (items[i].send || remote(items[i].peer)) continue;
      // The descriptor's arrival is a wait on the device (never a host function that waits);
      // the watchdog meanwhile looks for a host message of this number (p2p_waits_).
      const int p = items[i].peer;
      uint64_t* word = reinterpret_cast<uint64_t*>(copy_->p2p_slot(p, ring[i]));
      note_p2p_waits({{p, descs[i]}}, true);
      note_wait(StreamWait{word, ring[i], p, false, seq_, WaitFor::MessageDesc});
      device_->wait_value(reinterpret_cast<uint64_t*>(copy_->p2p_slot(p, ring[i], true)), ring[i], s);
      device_->host_func([this, p, k = ring[i], d = descs[i], call = seq_] { p2p_check_desc(p, k, d, call); }, s);
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

bool StreamEngine::device_message(int peer, const CallDesc& want, CallDesc* sent) {
  // Called by the host executor while a receive of message `want.seq` from `peer` waits: the
  // peer's descriptors in this rank's ring (any slot: numbers are never reused) name the messages
  // it sent on device buffers. Peers on other hosts send theirs over NCCL, unseen here.
  if (!copy_->has_region() || peer < 0 || peer >= size_ || peer == rank_ || remote(peer)) return false;
  for (uint64_t k = 0; k < CopyPath::kP2PRing; ++k) {
    const char* slot = copy_->p2p_slot(peer, k);
    if (!seq_word(const_cast<char*>(slot)).load(std::memory_order_acquire)) continue;
    CallDesc d;
    std::memcpy(&d, slot + 8, sizeof d);
    if (d.coll == want.coll && d.seq == want.seq) {
      *sent = d;
      return true;
    }
  }
  return false;
}

void StreamEngine::check_host_messages() {
  std::vector<std::pair<int, CallDesc>> waits;
  {
    std::lock_guard<std::mutex> lk(mu_);
    waits = p2p_waits_;
  }
  for (const auto& [peer, want] : waits) {
    CallDesc host;
    if (!control_->peek_host_message(peer, &host) || host.coll != want.coll || host.seq != want.seq) continue;
    const std::string me = std::to_string(rank_), them = std::to_string(peer);
    return fail(ErrorKind::Mismatch, "rank " + me + " receives " + describe_call(want) + " from rank " + them +
                                         " but rank " + them + " sent " + describe_call(host) + " from a host buffer");
  }
}

void StreamEngine::check_first_p2p(const std::vector<P2PItem>& items, DType dtype) {
  for (const P2PItem& it : items) {
    if (it.send || it.peer < 0 || it.peer >= size_ || it.peer == rank_) continue;
    CallDesc want;
    want.coll = static_cast<uint8_t>(Collective::Send);
    want.dtype = static_cast<uint8_t>(dtype);
    want.algo = kDeviceCallAlgoBit;
    want.count = it.count;
    want.seq = control_->peek_p2p_seq(it.peer, false);
    CallDesc host;
    if (!control_->peek_host_message(it.peer, &host) || host.coll != want.coll || host.seq != want.seq) continue;
    const std::string them = std::to_string(it.peer);
    const std::string msg = "rank " + std::to_string(rank_) + " receives " + describe_call(want) + " from rank " + them +
                            " but rank " + them + " sent " + describe_call(host) + " from a host buffer";
    fail(ErrorKind::Mismatch, msg);
    raise_to_caller(ErrorKind::Mismatch, msg);
  }
}

}  // namespace commlib
