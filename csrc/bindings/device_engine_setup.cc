// The stream engine's set-up in C++ (device_engine_setup.h): the rendezvous's waits and messages,
// as commlib/core/device_route.py `_wait_key` and commlib/device/nccl_comm.py `agree_link_setting`
// stated them (their tests: tests/stream's set-up failure cases).
#include "bindings/device_engine_setup.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <regex>
#include <stdexcept>
#include <thread>
#include <vector>

#include "bindings/peer_control.h"
#include "common/errors.h"
#include "stream/device_link.h"
#include "stream/stream_engine_options.h"

namespace commlib {
namespace {

using Clock = std::chrono::steady_clock;

// bootstrap/wait.py's pauses: a fast peer is seen at once, a slow one costs the store little.
constexpr double kFirstPauseS = 0.0005, kMaxPauseS = 0.02;
// How often a wait asks the control plane whether the rank it waits for is gone.
constexpr double kPeerCheckS = 0.1;
// A reported error is cut to this many bytes (a peer writes it; keep messages bounded).
constexpr size_t kReportBytes = 2000;

std::string seconds_text(double s) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%g", s);  // as Python's f"{s:g}"
  return buf;
}

// A process on this host that no longer runs (absent or a zombie): core/shrink.py process_gone.
bool process_gone(int pid) {
  if (pid <= 0) return false;
  std::ifstream f("/proc/" + std::to_string(pid) + "/stat");
  if (!f) return true;
  std::string stat((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  const size_t close = stat.rfind(')');
  if (close == std::string::npos || close + 2 >= stat.size()) return false;
  const char state = stat[close + 2];
  return state == 'Z' || state == 'X';
}

// Rank `peer` is dead or closed as this rank sees it (core/shrink.py gone_peers).
bool peer_gone(Communicator& comm, int peer) {
  if (!comm.has_transport()) return false;
  const PeerStatus st = comm.transport().peer_status(peer, true);
  if (st.state == PeerState::Dead || st.state == PeerState::Closed) return true;
  const auto& kinds = comm.link_kinds();
  return peer < static_cast<int>(kinds.size()) && kinds[peer] == "shm" && process_gone(comm.transport().peer_pid(peer));
}

// A report's text as a peer wrote it: bounded, cut at a character boundary (UTF-8).
std::string bounded(std::string s) {
  if (s.size() <= kReportBytes) return s;
  size_t n = kReportBytes;
  while (n > 0 && (static_cast<unsigned char>(s[n]) & 0xC0) == 0x80) --n;
  s.resize(n);
  return s;
}

class Waiter {
 public:
  Waiter(const DeviceEngineSetup& s, SetupStore& store) : s_(s), store_(store) {}

  // The value under `key` (bootstrap/wait.py wait_for_key): every round `round()` (may throw), the
  // error key if `error_key`, then the timeout (`on_timeout()`'s message, a CommError), counted
  // from this wait's start (each key its own timeout, as the Python waits had).
  template <typename Round, typename OnTimeout>
  std::string wait(const std::string& key, bool error_key, Round round, OnTimeout on_timeout) {
    const auto deadline =
        Clock::now() + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(s_.timeout_s));
    double pause = kFirstPauseS;
    std::string value;
    while (true) {
      if (store_.try_get(key, &value)) return value;
      round();
      std::string why;
      if (error_key && store_.try_get(s_.prefix + "/error", &why))
        throw_reported_setup_failure(bounded(why), s_.comm.rank());
      if (Clock::now() > deadline) throw CommError(on_timeout());
      std::this_thread::sleep_for(std::chrono::duration<double>(pause));
      pause = std::min(pause * 2, kMaxPauseS);
    }
  }

  // Rank `r`'s engine handle (device_route.py _wait_key).
  std::string handle_of(int r, StreamEngine& engine) {
    const std::string key = s_.prefix + "/" + std::to_string(r);
    auto next_check = Clock::now() + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(kPeerCheckS));
    const int me = s_.comm.rank();
    return wait(
        key, true,
        [&] {
          if (s_.poll) s_.poll(engine);
          const auto now = Clock::now();
          if (now < next_check) return;
          next_check = now + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(kPeerCheckS));
          std::string ignored;
          if (peer_gone(s_.comm, r) && !store_.try_get(key, &ignored))
            throw PeerError(s_.what + ": stream engine set-up: rank " + std::to_string(me) + " waits for rank " +
                            std::to_string(r) + "'s first call on device buffers, but rank " + std::to_string(r) +
                            " is gone (its process died, its connection was lost or it closed its communicator)");
        },
        [&] {
          return "stream engine set-up: rank " + std::to_string(me) + " waited " + seconds_text(s_.timeout_s) +
                 " s (COMMLIB_TIMEOUT) for rank " + std::to_string(r) +
                 ", which has not made its first call on device buffers";
        });
  }

  // Every rank's engine read the same COMMLIB_DEVICE_LINK (nccl_comm.py agree_link_setting).
  void agree_link_setting(StreamEngine& engine) {
    const int me = s_.comm.rank(), size = s_.comm.size();
    if (size < 2) return;
    const std::string base = s_.prefix + "/link",
                      mine = std::string("COMMLIB_DEVICE_LINK=") + device_link_setting_name(engine.link_setting());
    store_.set(base + "/" + std::to_string(me), mine);
    for (int r = 0; r < size; ++r) {
      if (r == me) continue;
      const std::string theirs = wait(base + "/" + std::to_string(r), true, [] {}, [&] {
        return "NCCL set-up: rank " + std::to_string(me) + " waited " + seconds_text(s_.timeout_s) +
               " s (COMMLIB_TIMEOUT) for rank " + std::to_string(r) + "'s device link setting";
      });
      if (theirs != mine)
        throw MismatchError("rank " + std::to_string(me) + " has the device link setting " + mine + " but rank " +
                            std::to_string(r) + " has " + theirs);
    }
  }

 private:
  const DeviceEngineSetup& s_;
  SetupStore& store_;
};

}  // namespace

std::string setup_failure_report(int rank, const std::exception& e) {
  const char* cls = nullptr;
  if (auto* c = dynamic_cast<const CommError*>(&e)) {
    const ErrorKind k = kind_of(*c);
    cls = k == ErrorKind::Mismatch ? "MismatchError" : k == ErrorKind::Peer ? "PeerError" : "CommError";
  } else if (dynamic_cast<const std::invalid_argument*>(&e)) {
    cls = "ValueError";
  }
  std::string what = e.what();
  // A Python error raised in the store (pybind11's error_already_set) says "Class: message" itself.
  static const std::regex classed(R"(^\w+: [\s\S]*)");
  if (cls == nullptr && std::regex_match(what, classed)) return "rank " + std::to_string(rank) + ": " + what;
  return "rank " + std::to_string(rank) + ": " + (cls ? cls : "RuntimeError") + ": " + what;
}

void throw_reported_setup_failure(const std::string& why, int rank) {
  // bootstrap/wait.py reported_failure: a dead peer or a mismatch is one event, raised with its own
  // class on every rank whichever rank saw it first; anything else is the set-up's CommError.
  static const std::regex report(R"(rank (\d+): (\w+): ([\s\S]*))");
  std::smatch m;
  if (std::regex_match(why, m, report) && (m[2] == "PeerError" || m[2] == "MismatchError")) {
    const std::string msg = m[3].str() + " (reported to rank " + std::to_string(rank) + " by rank " + m[1].str() + ")";
    if (m[2] == "PeerError") throw PeerError(msg);
    throw MismatchError(msg);
  }
  throw CommError("stream engine set-up failed: " + why);
}

std::shared_ptr<StreamEngine> set_up_device_engine(const DeviceEngineSetup& s, SetupStore& store) {
  const int me = s.comm.rank(), size = s.comm.size();
  try {
    auto engine = std::make_shared<StreamEngine>(s.device, communicator_peer_control(s.comm), s.comm.plan_context(),
                                                 stream_engine_options_from_env(s.timeout_s, s.label));
    Waiter waiter(s, store);
    if (s.poll) s.poll(*engine);  // a host side already aborted raises here, before the rendezvous
    // Every pair's link is chosen before this rank publishes anything (connect() chooses them again):
    // a setting that links some pair nowhere (ipc across hosts) is then this rank's own ValueError on
    // every rank it concerns, not a race with a peer's report of the same refusal (a CommError).
    const LinkTopology topo{s.comm.topology().host_of};
    for (int p = 0; p < size; ++p)
      if (p != me) choose_device_link(topo, me, p, engine->link_setting());
    store.set(s.prefix + "/" + std::to_string(me), engine->local_handle());
    std::vector<std::string> handles;
    handles.reserve(size);
    for (int r = 0; r < size; ++r) handles.push_back(waiter.handle_of(r, *engine));
    waiter.agree_link_setting(*engine);  // COMMLIB_DEVICE_LINK, the same everywhere
    engine->connect(handles, s.comm.topology().host_of);  // the link per pair; maps this host's peers
    return engine;
  } catch (const std::exception& e) {
    try {  // the other ranks stop waiting for this one
      store.set(s.prefix + "/error", setup_failure_report(me, e));
    } catch (...) {  // the original error is what matters
    }
    throw;
  }
}

}  // namespace commlib
