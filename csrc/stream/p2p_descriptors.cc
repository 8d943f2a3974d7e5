// Point-to-point message descriptors (p2p_descriptors.h).
#include "stream/p2p_descriptors.h"

#include <cstring>

#include "device/host_flags.h"
#include "plan/describe.h"
#include "stream/peer_control.h"

namespace commlib {

namespace {

std::atomic<uint64_t>& seq_word(char* slot) { return *reinterpret_cast<std::atomic<uint64_t>*>(slot); }

}  // namespace

P2PDescriptors::P2PDescriptors(CopyPath& copy, PeerControl& control, CopyPathHost& host, const std::atomic<bool>& failed,
                               int rank, int size)
    : copy_(copy), control_(control), host_(host), failed_(failed), rank_(rank), size_(size), sent_(size, 0),
      received_(size, 0) {}

void P2PDescriptors::send(int peer, uint64_t k, const CallDesc& desc) {
  char* slot = copy_.peer_p2p_slot(peer, k);
  std::memcpy(slot + 8, &desc, sizeof desc);
  store_flag(reinterpret_cast<uint64_t*>(slot), k);
}

void P2PDescriptors::note_waits(const std::vector<std::pair<int, CallDesc>>& waits, bool add) {
  std::lock_guard<std::mutex> lk(mu_);
  for (const auto& w : waits) {
    if (w.second.coll != static_cast<uint8_t>(Collective::Send)) continue;
    if (add) {
      waits_.push_back(w);
      continue;
    }
    for (auto it = waits_.begin(); it != waits_.end(); ++it)
      if (it->first == w.first && it->second == w.second) {
        waits_.erase(it);
        break;
      }
  }
}

void P2PDescriptors::check(int peer, uint64_t k, const CallDesc& desc, uint64_t call) {
  // Runs after the stream's wait_value on the slot's word: the descriptor is there (or the wait
  // was released by a failure). Only reads and compares: a mismatch is recorded for the watchdog,
  // with the engine's number of the call (`call`): the stream goes on and may complete the call
  // before the watchdog fails the engine, and the call must raise the error all the same.
  note_waits({{peer, desc}}, false);
  const char* slot = copy_.p2p_slot(peer, k);
  const uint64_t s = seq_word(const_cast<char*>(slot)).load(std::memory_order_acquire);
  if (failed_.load(std::memory_order_acquire) || s < k) return;
  CallDesc sent;
  std::memcpy(&sent, slot + 8, sizeof sent);
  const std::string me = std::to_string(rank_), them = std::to_string(peer);
  if (s != k || sent != desc) copy_.stop_data();  // the receive's chunks skip: nothing lands in its buffer
  if (s != k)  // cannot happen while both ranks follow the protocol (the ring outruns the slots)
    host_.fail_from_stream(ErrorKind::Mismatch, "rank " + me + " expects device message #" + std::to_string(k) + " from rank " +
                                              them + " but rank " + them + " is already at its device message #" +
                                              std::to_string(s),
                     call);
  else if (sent != desc)
    host_.fail_from_stream(ErrorKind::Mismatch, "rank " + me + " receives " + describe_call(desc) + " from rank " + them +
                                              " but rank " + them + " sent " + describe_call(sent),
                     call);
}

bool P2PDescriptors::device_message(int peer, const CallDesc& want, CallDesc* sent) const {
  // Called by the host executor while a receive of message `want.seq` from `peer` waits: the
  // peer's descriptors in this rank's ring (any slot: numbers are never reused) name the messages
  // it sent on device buffers. Peers on other hosts send theirs over NCCL, unseen here.
  if (!copy_.has_region() || peer < 0 || peer >= size_ || peer == rank_ || copy_.remote(peer)) return false;
  for (uint64_t k = 0; k < CopyPath::kP2PRing; ++k) {
    const char* slot = copy_.p2p_slot(peer, k);
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

bool P2PDescriptors::host_message_mismatch(std::string* message) {
  std::vector<std::pair<int, CallDesc>> waits;
  {
    std::lock_guard<std::mutex> lk(mu_);
    waits = waits_;
  }
  for (const auto& [peer, want] : waits) {
    CallDesc host;
    if (!control_.peek_host_message(peer, &host) || host.coll != want.coll || host.seq != want.seq) continue;
    const std::string me = std::to_string(rank_), them = std::to_string(peer);
    *message = "rank " + me + " receives " + describe_call(want) + " from rank " + them + " but rank " + them +
               " sent " + describe_call(host) + " from a host buffer";
    return true;
  }
  return false;
}

bool P2PDescriptors::first_call_mismatch(const std::vector<P2PItem>& items, DType dtype, std::string* message) const {
  for (const P2PItem& it : items) {
    if (it.send || it.peer < 0 || it.peer >= size_ || it.peer == rank_) continue;
    CallDesc want;
    want.coll = static_cast<uint8_t>(Collective::Send);
    want.dtype = static_cast<uint8_t>(dtype);
    want.algo = kDeviceCallAlgoBit;
    want.count = it.count;
    want.seq = control_.peek_p2p_seq(it.peer, false);
    CallDesc host;
    if (!control_.peek_host_message(it.peer, &host) || host.coll != want.coll || host.seq != want.seq) continue;
    const std::string them = std::to_string(it.peer);
    *message = "rank " + std::to_string(rank_) + " receives " + describe_call(want) + " from rank " + them +
               " but rank " + them + " sent " + describe_call(host) + " from a host buffer";
    return true;
  }
  return false;
}

}  // namespace commlib
