// TCP transport: the links between ranks on different hosts, and their control plane.
//
// N connections ("lanes", COMMLIB_TCP_NCONNS) per remote peer (the higher rank connects to the
// lower one after both published their listening address through the store); DATA frame s of a
// direction travels on lane s % N (tcp_conn.h), so TCP's per-stream order is all the receiver
// needs. Every lane is authenticated by an HMAC challenge-response when
// COMMLIB_SECRET is set (tcp_socket.h). One progress thread per communicator runs an epoll loop:
// it accepts and vets connections, reads frames into bounded per-peer receive rings, finishes
// sends the caller's thread could not complete without blocking, and sends this rank's current
// call to its peers every 50 ms while it changes (what mismatch detection reads when no data flows).
//
// Frames on a connection: a 16-byte WireHeader, then a body: DATA (ChunkHeader + payload), CALL
// (CallDesc), FAIL (ErrorKind + message), CLOSE. Every field is checked before use; a peer that
// sends an impossible frame is marked failed (the job sees PeerError naming it) and its connection
// dropped. Flow control is TCP's own: when a receive ring is full the thread stops reading that
// socket, the kernel buffers fill, and the sender's writes would block, so its send ring fills.
//
// Zero-copy (docs/transports.md): a send slot may point at the caller's buffer instead of holding
// the payload (sendmsg gathers headers + payload); the executor may post where the next message
// goes, and matching chunks are read straight there; a waiting caller reads its sockets itself.
#pragma once

#include <sys/types.h>

#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <condition_variable>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "transport/link.h"
#include "transport/tcp/tcp_socket.h"
#include "transport/transport.h"

namespace commlib {

struct TcpConfig {
  uint64_t chunk_bytes = 512 << 10;  // COMMLIB_TCP_CHUNK_BYTES (must agree on all ranks)
  uint32_t nslots = 4;               // chunks buffered per direction per peer (at least 2 per lane)
  uint32_t nconns = 1;               // COMMLIB_TCP_NCONNS: lanes per peer pair (must agree on all ranks)
  int64_t spin_us = 1000;            // COMMLIB_TCP_SPIN_US: how long a waiting caller polls its sockets
  double timeout_s = 300.0;
  int debug = 0;
};
TcpConfig tcp_config_from_env(double timeout_s, int debug);

class TcpTransport final : public Transport {
 public:
  // Listens at once (address()); connect() later, once every rank's address is known.
  // `remote[r]` says which ranks this rank reaches over TCP.
  TcpTransport(int rank, int size, const std::string& comm_id, std::vector<bool> remote, TcpConfig cfg);
  ~TcpTransport() override;

  std::string address() const { return listen_addr_.str(); }
  // Connects to every remote rank below this one and waits for every remote rank above it to
  // connect here, all within the timeout. `addresses[r]` is rank r's address ("" if not remote).
  // `poll` (if set) runs every few tens of milliseconds while it waits, on the calling thread with
  // no lock held; whatever it throws ends the connect (a rendezvous's error key, a shrink's check
  // that no survivor died): a peer that died before connecting stops nobody until the timeout.
  void connect(const std::vector<std::string>& addresses, const std::function<void()>& poll = {});
  bool authenticated() const { return !key_.empty(); }
  bool reaches(int r) const { return r >= 0 && r < size_ && remote_[r]; }  // `remote` at creation
  // Connections refused so far (failed handshakes, garbage, unknown ranks): tests read it.
  uint64_t rejected() const { return rejected_.load(); }
  // Which data paths ran (tests check that zero-copy and caller polling are taken).
  struct Stats {
    uint64_t sent_in_place = 0, landed = 0, frames_read_by_caller = 0;
    uint64_t lanes = 1, frames_striped = 0;  // lanes per peer; DATA frames sent on lanes other than 0
    // recv calls that returned data; times a caller took its sockets from the progress thread,
    // and times the progress thread took them back from a caller that had stopped polling.
    uint64_t recv_reads = 0, caller_takes = 0, reclaims = 0;
    uint64_t spins_out = 0;  // a caller's spins that ran their whole time with nothing delivered
  };
  Stats stats() const {
    return {sent_in_place_.load(), landed_.load(),   frames_read_by_caller_.load(), cfg_.nconns,
            frames_striped_.load(), recv_reads_.load(), caller_takes_.load(),          reclaims_.load(),
            spins_out_.load()};
  }

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  size_t chunk_bytes() const { return cfg_.chunk_bytes; }
  size_t channel_bytes() const { return cfg_.nslots * cfg_.chunk_bytes; }
  std::unique_ptr<Link> make_link(int peer) override;  // peer: a global rank this endpoint reaches

  // The waiting caller's spin (tcp_spin.cc): polls this rank's sockets from the calling thread,
  // offering the core between polls, until `local`'s event counter leaves `seen` (a delivery from
  // either domain) or the spin time (COMMLIB_TCP_SPIN_US) is up; true if it moved. While a caller
  // polls, the progress thread leaves the sockets to it; the caller keeps them after a successful
  // spin (the next wait polls again, no epoll change per call) and hands them back before it
  // sleeps; the progress thread takes them back once nobody polled for a while.
  bool spin_until(Transport& local, uint32_t seen) override;
  // The caller's thread reads whatever its sockets hold (no hand-off through the progress
  // thread); returns at once where the progress thread is reading. Rings the doorbell on delivery.
  void poll();
  // While held, the progress thread leaves reading to the polling caller (no epoll wake-up and
  // hand-off for data it would only race the caller for).
  void hold_reading(bool hold);

  uint32_t events() override { return events_.load(std::memory_order_acquire); }
  void wait_events(uint32_t seen, int64_t timeout_us) override;
  void wake() override;
  // Also wake this (another domain's) event counter whenever TCP delivers something.
  void set_waker(Transport* other) override { waker_ = other; }

  PeerStatus peer_status(int peer, bool check_process) override;
  void publish_failure(ErrorKind kind, const std::string& message) override;
  void publish_call(const CallDesc& d) override;
  bool peer_call(int peer, CallDesc* d) override;
  int peer_pid(int peer) override;
  void close() override;

  struct Lane;
  struct Conn;
  struct Pending;

 private:
  friend class TcpLink;
  Conn* conn(int peer) const;
  void progress_loop();
  void reclaim_reading_if_idle();  // progress thread: take the sockets back from a caller gone elsewhere
  uint64_t publish(Conn& c, const char* ref);
  void on_readable(Conn& c, Lane& l);  // with c.recv_mu held
  ssize_t lane_read(Lane& l, int fd, char* dst, size_t want, bool* drained);
  void read_lanes(Conn& c);            // every lane that may read (c.recv_mu held)
  bool land_or_ring(Conn& c, Lane& l);
  bool handle_frame_header(Conn& c, Lane& l);
  bool ring_has_space(Conn& c, Lane& l);
  void frame_done(Conn& c, Lane& l);
  void handle_control(Conn& c, Lane& l);
  bool write_lane(Conn& c, Lane& l);  // takes l.send_mu; true when nothing is left to write
  bool flush_lane(Conn& c, Lane& l, bool* freed);  // with l.send_mu held
  void advance_send_head(Conn& c);
  void enqueue_control(Conn& c, Lane& l, uint16_t type, const void* body, size_t n);
  void request_write();
  void mark_down(Conn& c, PeerState st, const std::string& why);
  void attach(Conn& c, uint32_t lane, int fd);
  int connect_lane(int q, const SockAddr& a, uint32_t lane, double deadline, const std::function<void()>& poll);
  void accept_new();
  void advance_pending(Pending& p);
  void drop_pending(Pending& p, const std::string& why, bool counted = false);
  void evict_pending();
  void forget_dropped_pending();  // erases the entries drop_pending emptied
  void refuse_pending(Pending& p, const std::string& why);
  void update_interest(Conn& c, Lane& l);
  void send_calls();
  void log_warn(const std::string& msg);
  void protocol_error(Conn& c, Lane& l, const std::string& what);
  void drop_lane(Conn& c, Lane& l);
  void drop_conn(Conn& c);  // every lane: a peer that lost one lane is gone

  int rank_, size_;
  uint8_t comm_id_[16];
  std::vector<bool> remote_;
  TcpConfig cfg_;
  std::string key_;
  SockAddr listen_addr_;
  int listen_fd_ = -1, epoll_fd_ = -1, event_fd_ = -1;
  std::vector<std::unique_ptr<Conn>> conns_;  // by global rank; null for ranks not reached by TCP
  std::vector<std::unique_ptr<Pending>> pending_;  // handshakes in progress (progress thread only)
  std::thread thread_;
  std::atomic<bool> stop_{false};
  std::atomic<bool> draining_{false};  // closing: incoming data is read and dropped
  std::atomic<uint32_t> events_{0};
  std::atomic<uint32_t> sleeping_{0};
  std::atomic<bool> caller_holds_{false};  // a caller reads the sockets (hold_reading(true))
  std::atomic<int64_t> last_poll_ns_{0};   // when a caller last polled them (steady_clock, ns)
  Transport* waker_ = nullptr;
  std::atomic<uint64_t> rejected_{0};
  std::atomic<uint64_t> sent_in_place_{0}, landed_{0}, frames_read_by_caller_{0}, frames_striped_{0};
  std::atomic<uint64_t> recv_reads_{0}, caller_takes_{0}, reclaims_{0}, spins_out_{0};
  std::atomic<int> warnings_{0};

  std::mutex call_mu_;
  CallDesc my_call_;
  uint64_t my_call_version_ = 0, sent_call_version_ = 0;

  std::mutex connect_mu_;
  std::condition_variable connect_cv_;
  bool closed_ = false;
  std::string connect_error_;  // a proven peer that cannot be taken (lane counts differ); under connect_mu_
};

// One remote peer's connection: send ring (zero-copy sends allowed), receive ring (posted
// receives land in place), no single-copy reads. Defined in tcp_send.cc and tcp_recv.cc.
class TcpLink final : public Link {
 public:
  TcpLink(TcpTransport& t, int peer) : t_(t), c_(*t.conn(peer)), peer_(peer) {}
  ChunkHeader* acquire_send(char** payload) override;
  void publish_send() override;
  const ChunkHeader* peek_recv(const char** payload) override;
  void release_recv() override;
  void read_peer(void* dst, uint64_t remote, size_t bytes) override;
  uint64_t publish_send_in_place(const char* data) override;
  uint64_t sends_completed() override;
  void detach_sends() override;
  void post_recv(const CallDesc& d, char* dst, size_t bytes, size_t chunk) override;
  void unpost_recv() override;

 protected:
  LinkCaps query_caps() const override;

 private:
  TcpTransport& t_;
  TcpTransport::Conn& c_;
  int peer_;
};

}  // namespace commlib
