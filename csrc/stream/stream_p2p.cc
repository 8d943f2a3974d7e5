// Point-to-point messages on the stream engine (see stream_engine.h): send / recv / batches of
// them, and all_to_all with splits (a batch), on device buffers. The engine checks the batch,
// numbers it and its messages (one numbering per pair with the host messages) and tracks it in
// flight; the messages move on the point-to-point path (stream/p2p_path.h), behind the device
// paths' interface (stream/device_path.h).
#include <stdexcept>
#include <string>

#include "plan/lowering.h"  // failed_peer_error
#include "stream/stream_engine.h"

namespace commlib {

std::shared_ptr<DeviceWork> StreamEngine::p2p(const std::vector<P2PItem>& items, DType dtype, DeviceStream& s,
                                              const CaptureStatus* known_capture) {
  return run_p2p(items, dtype, s, known_capture, nullptr);
}

std::shared_ptr<DeviceWork> StreamEngine::all_to_allv(const std::vector<P2PItem>& items, DType dtype, int64_t count,
                                                      DeviceStream& s, const CaptureStatus* known_capture) {
  if (count < 0) throw std::invalid_argument("count: negative");
  return run_p2p(items, dtype, s, known_capture, &count);
}

std::shared_ptr<DeviceWork> StreamEngine::run_p2p(const std::vector<P2PItem>& items, DType dtype, DeviceStream& s,
                                                  const CaptureStatus* known_capture, const int64_t* a2av_count) {
  std::lock_guard<std::mutex> guard(enqueue_mu_);
  throw_if_failed_locked();
  try {
    DeviceGuard current(*device_);
    if ((known_capture ? *known_capture : device_->capture_status(s)) != CaptureStatus::None)  // stream_capture.cc
      throw CommError("rank " + std::to_string(rank_) + " cannot capture point-to-point messages in a CUDA graph: they "
                      "run on the copy path, which refuses capture");
    if (kernel_) kernel_->collect_arenas(s);  // retired staging arenas every rank is done with (kernel_path_arena.cc)
    return enqueue_p2p(items, dtype, s, a2av_count);
  } catch (const CommError&) {
    throw;
  } catch (const std::invalid_argument&) {
    throw;
  } catch (const std::exception& e) {
    device_error("enqueueing point-to-point messages", e);
  }
}

std::shared_ptr<DeviceWork> StreamEngine::enqueue_p2p(const std::vector<P2PItem>& items, DType dtype, DeviceStream& s,
                                                      const int64_t* a2av_count) {
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
  CallDesc message;  // what each message's descriptor starts from (its count and number per pair below)
  message.coll = static_cast<uint8_t>(Collective::Send);
  message.dtype = static_cast<uint8_t>(dtype);
  message.algo = kDeviceCallAlgoBit;
  for (const P2PItem& it : items) message.count += it.count;
  // The call, for error messages: the batch (its messages' total), or the collective it is, which
  // takes the communicator's next number here, after the checks above refused nothing (a refused
  // argument leaves the numbering as it was), as a collective takes its number (stream_calls.cc).
  CallDesc call = message;
  if (a2av_count) {
    call.coll = static_cast<uint8_t>(Collective::AllToAll);
    call.count = *a2av_count;
    call.seq = control_->next_call_seq();
    ErrorKind kind;
    std::string msg;
    if (failed_peer_error(call, rank_, size_, [this](int p) { return control_->peer_status(p, false); }, &kind, &msg)) {
      fail(kind, msg);
      raise_to_caller(kind, msg);
    }
  }
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
  std::vector<CallDesc> descs(items.size(), message);
  std::vector<uint64_t> ring(items.size());  // the pair's device message index
  for (size_t i = 0; i < items.size(); ++i) {
    descs[i].count = items[i].count;
    descs[i].seq = control_->next_p2p_seq(items[i].peer, items[i].send);
    ring[i] = p2p_descs_->next_index(items[i].peer, items[i].send);
  }
  // The messages move on the point-to-point path (stream/p2p_path.h), behind the paths' interface.
  CollectiveCall summary;
  summary.coll = Collective::Send;
  summary.dtype = dtype;
  summary.count = message.count;
  const P2PBatch batch{items, dtype, descs, ring};
  Launched launched;
  std::string enqueue_error;
  try {
    launched = p2p_path_->enqueue(PathCall{P2PPath::no_plan(), summary, call, nullptr, seq_, false, nullptr, nullptr, &batch}, s);
  } catch (const std::exception& e) {
    enqueue_error = "rank " + std::to_string(rank_) + " could not enqueue " +
                    (a2av_count ? describe_call(call) + " (" : std::string("a batch of ")) + std::to_string(items.size()) +
                    " sends/receives" + (a2av_count ? ")" : "") + ": " + e.what();
    fail_as(ErrorKind::Comm, ErrorKind::Peer, enqueue_error, true);  // PeerError at the peers (stream_calls.cc)
  }
  CallWork work;
  finish(launched, enqueue_error, s, &work);  // the copy path's chunks: an event
  return std::make_shared<DeviceWork>(shared_from_this(), std::move(work.done), work.seq);
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
