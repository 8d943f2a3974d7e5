// A client of commlib's own rendezvous store (the server: commlib/bootstrap/store_server.py; the wire:
// store_wire.h), for C++ that must meet the other ranks without Python: the stream engine's set-up
// (bindings/commlib_setup_store.h). It does what commlib.bootstrap.store.TCPStore does for set and
// a non-blocking read, with the same failures under the same classes and texts (store_error.h): a
// silent server is "no answer to <op> <key> within T s", a closed or reset connection StoreLostError
// "connection lost during <op> <key> (<why>): <lost_advice>", a refused write "refused set <key>:
// <why>". Every operation has the store's timeout (TCPStore's `timeout`, read once by the caller).
//
// One connection, opened at the first operation (a hello first: the server must be a commlib store)
// and closed by close() or the destructor: the set-up holds it only while it runs, so that a server
// waiting for its clients to go (commlib/bootstrap/store_lease.py) is not held by an idle one. Not
// thread-safe: the caller serialises (one set-up at a time).
#pragma once

#include <string>

namespace commlib {

struct StoreAddress {
  std::string host;   // numeric, as the Python store's socket reached it (IPv4 or IPv6)
  int port = 0;
  std::string where;  // "host:port" as the Python store names it in its messages
  double timeout_s = 300.0;
  // After "connection lost during <op> <key> (<why>): ": the Python store's text for a server that
  // closed the connection (store.py: the rank-0 text when rank 0's process served it).
  std::string lost_advice;
  // Appended to "no answer ... expected a commlib store" (empty unless rank 0's process serves it).
  std::string silent_advice;
};

class StoreClient {
 public:
  explicit StoreClient(StoreAddress address) : a_(std::move(address)) {}
  ~StoreClient() { close(); }
  StoreClient(const StoreClient&) = delete;
  StoreClient& operator=(const StoreClient&) = delete;

  void set(const std::string& key, const std::string& value);
  // The value under `key` if it is set, without waiting (a GET with no wait: one round trip).
  // `op` names the operation in a failure's message ("check": what the Python store's poll was).
  bool try_get(const std::string& key, std::string* value, const char* op = "check");
  void close();
  const StoreAddress& address() const { return a_; }

 private:
  // One request, its reply frame within the timeout; every failure a StoreError naming op and key.
  std::string exchange(const char* op, const std::string& key, const std::string& request);
  void connect(const char* op, const std::string& key);
  [[noreturn]] void fail_io(const char* op, const std::string& key, int err);
  void send_all(const char* op, const std::string& key, const std::string& bytes);
  void recv_exact(const char* op, const std::string& key, char* out, size_t n, double deadline);

  StoreAddress a_;
  int fd_ = -1;
};

}  // namespace commlib
