// The stream engine's set-up and enqueue path (see stream_engine.h); the watchdog, the call
// descriptor check and failure handling are in stream_watchdog.cc.
#include "engine/stream_engine.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <sstream>

#include "common/params.h"
#include "engine/auto_policy.h"
#include "schedule/registry.h"

namespace commlib {

namespace {

constexpr size_t kLine = 64;      // one counter per cache line: ranks write them concurrently
constexpr uint64_t kRing = 64;    // call descriptors kept per rank
constexpr size_t kRingSlot = 64;  // bytes per descriptor slot: seq (written last), CallDesc
// Point-to-point message descriptors kept per sender: more than the chunks a sender can have in
// flight (COMMLIB_DEVICE_SLOTS <= 64), and every message moves at least one chunk, so a sender
// never overwrites a descriptor its receiver has not checked yet.
constexpr uint64_t kP2PRing = 128;
constexpr size_t kP2PSlot = 64;  // seq (written last), CallDesc

int64_t input_elements(Collective c, int64_t count, int size) {
  return (c == Collective::ReduceScatter || c == Collective::AllToAll || c == Collective::Scatter) ? count * size
                                                                                                   : count;
}

// "<pid>:<fd>:<bytes>" fields, strictly parsed (handles come through the store).
std::vector<uint64_t> parse_fields(const std::string& s, size_t n, const std::string& what) {
  std::vector<uint64_t> out;
  std::stringstream ss(s);
  std::string f;
  while (std::getline(ss, f, ':')) {
    if (f.empty() || f.size() > 19 || f.find_first_not_of("0123456789") != std::string::npos) break;
    out.push_back(std::stoull(f));
  }
  if (out.size() != n) throw std::invalid_argument("stream engine: malformed " + what + " '" + s + "'");
  return out;
}

}  // namespace

StreamEngineOptions stream_engine_options_from_env(double timeout_s, const std::string& label) {
  StreamEngineOptions o;
  o.timeout_s = timeout_s;
  o.label = label;
  o.slot_bytes = param_bytes("COMMLIB_DEVICE_SLOT_BYTES");
  if (o.slot_bytes < 64 || o.slot_bytes > (uint64_t{1} << 30) || o.slot_bytes % 64)
    throw std::invalid_argument("COMMLIB_DEVICE_SLOT_BYTES: must be a multiple of 64 in [64, 2^30], got " +
                                std::to_string(o.slot_bytes));
  o.nslots = static_cast<uint32_t>(param_int("COMMLIB_DEVICE_SLOTS", 1, 64));
  o.streams = static_cast<int>(param_int("COMMLIB_DEVICE_STREAMS", 1, 2));
  return o;
}

size_t StreamEngine::ctl_bytes() const {
  return 2 * static_cast<size_t>(size_) * kLine + kRing * kRingSlot + static_cast<size_t>(size_) * kP2PRing * kP2PSlot;
}

char* StreamEngine::p2p_slot(char* ctl, int peer, uint64_t k) const {
  return ctl + 2 * static_cast<size_t>(size_) * kLine + kRing * kRingSlot +
         (static_cast<size_t>(peer) * kP2PRing + k % kP2PRing) * kP2PSlot;
}

uint64_t* StreamEngine::flag(char* ctl, int which, int peer) const {
  return reinterpret_cast<uint64_t*>(ctl + (static_cast<size_t>(which) * size_ + peer) * kLine);
}

char* StreamEngine::ring_slot(char* ctl, uint64_t seq) const {
  return ctl + 2 * static_cast<size_t>(size_) * kLine + (seq % kRing) * kRingSlot;
}

StreamEngine::StreamEngine(std::shared_ptr<Device> device, std::unique_ptr<PeerControl> control, int rank, int size,
                           StreamEngineOptions opts)
    : device_(std::move(device)),
      control_(std::move(control)),
      rank_(rank),
      size_(size),
      opts_(std::move(opts)),
      peers_(size),
      sent_(size, 0),
      received_(size, 0),
      p2p_sent_(size, 0),
      p2p_received_(size, 0),
      nccl_(std::make_unique<NcclLink>(device_, rank, size, opts_.timeout_s)) {
  ctl_fd_ = memfd_create("commlib-device-ctl", MFD_CLOEXEC);
  if (ctl_fd_ < 0 || ftruncate(ctl_fd_, static_cast<off_t>(ctl_bytes())) != 0)
    throw std::runtime_error(std::string("stream engine: control region: ") + std::strerror(errno));
  void* p = mmap(nullptr, ctl_bytes(), PROT_READ | PROT_WRITE, MAP_SHARED, ctl_fd_, 0);
  if (p == MAP_FAILED) throw std::runtime_error(std::string("stream engine: mmap: ") + std::strerror(errno));
  ctl_ = static_cast<char*>(p);
  ctl_dev_ = device_->map_host(ctl_, ctl_bytes());
  inbox_ = device_->allocate(static_cast<size_t>(size_) * opts_.nslots * opts_.slot_bytes);
  own_stream_ = device_->create_stream();
  if (opts_.streams == 2) {
    send_stream_ = device_->create_stream();
    recv_stream_ = device_->create_stream();
    fork_ = device_->create_event();
    sent_step_ = device_->create_event();
    received_step_ = device_->create_event();
  }
  watchdog_ = std::thread([this] { watchdog_loop(); });
  // The host side's abort fails this engine too (its peers were told by the host side).
  host_listener_ = control_->on_host_abort([this](ErrorKind kind, const std::string& msg) { fail(kind, msg, false); });
}

StreamEngine::~StreamEngine() {
  try {
    close();
  } catch (...) {
  }
}

std::string StreamEngine::local_handle() const {
  // ctl:<pid>:<fd>:<bytes>;slots:<nslots>:<slot_bytes>;inbox:<device handle>
  return "ctl:" + std::to_string(getpid()) + ":" + std::to_string(ctl_fd_) + ":" + std::to_string(ctl_bytes()) +
         ";slots:" + std::to_string(opts_.nslots) + ":" + std::to_string(opts_.slot_bytes) +
         ";inbox:" + device_->export_memory(inbox_);
}

void StreamEngine::connect(const std::vector<std::string>& handles) {
  if (static_cast<int>(handles.size()) != size_)
    throw std::invalid_argument("handles: expected " + std::to_string(size_) + ", got " + std::to_string(handles.size()));
  for (int p = 0; p < size_; ++p) {
    if (p == rank_) continue;
    const std::string& h = handles[p];
    const size_t a = h.find(";slots:"), b = h.find(";inbox:");
    if (h.rfind("ctl:", 0) != 0 || a == std::string::npos || b == std::string::npos || b < a)
      throw std::invalid_argument("stream engine: malformed handle of rank " + std::to_string(p));
    auto ctl = parse_fields(h.substr(4, a - 4), 3, "control handle of rank " + std::to_string(p));
    auto slots = parse_fields(h.substr(a + 7, b - a - 7), 2, "slot settings of rank " + std::to_string(p));
    if (slots[0] != opts_.nslots || slots[1] != opts_.slot_bytes)
      throw std::invalid_argument("COMMLIB_DEVICE_SLOTS/COMMLIB_DEVICE_SLOT_BYTES: rank " + std::to_string(p) + " uses " +
                                  std::to_string(slots[0]) + " x " + std::to_string(slots[1]) + " bytes, rank " +
                                  std::to_string(rank_) + " " + std::to_string(opts_.nslots) + " x " +
                                  std::to_string(opts_.slot_bytes) + "; every rank must use the same");
    if (ctl[2] != ctl_bytes()) throw std::invalid_argument("stream engine: rank " + std::to_string(p) + " has another world size");
    const std::string path = "/proc/" + std::to_string(ctl[0]) + "/fd/" + std::to_string(ctl[1]);
    int fd = open(path.c_str(), O_RDWR | O_CLOEXEC);
    if (fd < 0) throw std::runtime_error("stream engine: cannot open rank " + std::to_string(p) + "'s control region " + path);
    struct stat st {};
    void* m = MAP_FAILED;
    if (fstat(fd, &st) == 0 && static_cast<uint64_t>(st.st_size) >= ctl[2])
      m = mmap(nullptr, ctl_bytes(), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    ::close(fd);
    if (m == MAP_FAILED) throw std::runtime_error("stream engine: cannot map rank " + std::to_string(p) + "'s control region");
    peers_[p].ctl = static_cast<char*>(m);
    peers_[p].ctl_bytes = ctl_bytes();
    peers_[p].ctl_dev = device_->map_host(m, ctl_bytes());
    peers_[p].inbox = static_cast<char*>(device_->import_memory(h.substr(b + 7)));
  }
  connected_ = true;
}

char* StreamEngine::grow(void*& buf, size_t& have, size_t bytes, DeviceStream& s) {
  if (bytes > have) {
    // Calls are ordered (each waits for the previous one), so a stream-ordered free is safe.
    if (buf) device_->free_async(buf, s);
    buf = nullptr;
    have = 0;
    buf = device_->allocate(bytes);
    have = bytes;
  }
  return static_cast<char*>(buf);
}

void StreamEngine::send_chunk(int p, const char* src, size_t bytes, uint64_t seq, DeviceStream& s) {
  const uint64_t c = sent_[p]++;
  if (c >= opts_.nslots) {
    const uint64_t target = c - opts_.nslots + 1;
    {
      std::lock_guard<std::mutex> lk(mu_);
      waits_.push_back(Wait{flag(ctl_, 1, p), target, p, true, seq});
    }
    device_->wait_value(flag(reinterpret_cast<char*>(ctl_dev_), 1, p), target, s);
  }
  char* slot = peers_[p].inbox + (static_cast<size_t>(rank_) * opts_.nslots + c % opts_.nslots) * opts_.slot_bytes;
  if (bytes) device_->copy(slot, src, bytes, s);
  device_->write_value(flag(reinterpret_cast<char*>(peers_[p].ctl_dev), 0, rank_), c + 1, s);
}

void StreamEngine::recv_chunk(int q, char* dst, const char* src, size_t bytes, bool reduce, DType dtype, RedOp op,
                              uint64_t seq, DeviceStream& s) {
  const uint64_t c = received_[q]++;
  {
    std::lock_guard<std::mutex> lk(mu_);
    waits_.push_back(Wait{flag(ctl_, 0, q), c + 1, q, false, seq});
  }
  device_->wait_value(flag(reinterpret_cast<char*>(ctl_dev_), 0, q), c + 1, s);
  const char* slot = static_cast<char*>(inbox_) +
                     (static_cast<size_t>(q) * opts_.nslots + c % opts_.nslots) * opts_.slot_bytes;
  if (bytes) {
    if (!reduce) {
      device_->copy(dst, slot, bytes, s);
    } else {
      if (src && src != dst) device_->copy(dst, src, bytes, s);
      device_->reduce(dst, slot, bytes / dtype_size(dtype), dtype, op, s);
    }
  }
  device_->write_value(flag(reinterpret_cast<char*>(peers_[q].ctl_dev), 1, rank_), c + 1, s);
}

void StreamEngine::enqueue_step(const Step& step, char* const bases[3], size_t esize, DType dtype, RedOp op,
                                const CallDesc& desc, DeviceStream& send_s, DeviceStream& s) {
  auto resolve = [&](const Region& r) -> char* {
    char* base = bases[static_cast<int>(r.buf)];
    if (!base) {
      if (r.count == 0) return nullptr;
      throw CommError(std::string("internal error: schedule of ") + describe_call(desc) + " on rank " +
                      std::to_string(rank_) + " uses the " + buffer_name(r.buf) + " buffer, which this rank does not have");
    }
    return base + static_cast<size_t>(r.offset) * esize;
  };
  // Local operations first: the schedule guarantees they touch nothing the messages touch.
  for (const Op& o : step.ops) {
    const size_t bytes = static_cast<size_t>((o.kind == OpKind::Send ? o.src : o.dst).count) * esize;
    if (o.kind == OpKind::Copy && bytes) {
      char* d = resolve(o.dst);
      const char* src = resolve(o.src);
      if (d != src) device_->copy(d, src, bytes, s);
    } else if (o.kind == OpKind::Reduce && bytes) {
      device_->reduce(resolve(o.dst), resolve(o.src), bytes / esize, dtype, op, s);
    }
  }
  // Messages to peers over the nccl link: one NCCL group, before the peer-memory chunks.
  if (nccl_->carries_any()) nccl_->enqueue_step(step, resolve, esize, dtype, op, s);
  const size_t chunk = std::max<size_t>(opts_.slot_bytes / esize * esize, esize);
  auto chunks = [&](size_t bytes) { return bytes ? (bytes + chunk - 1) / chunk : 1; };
  size_t rounds = 0;
  for (const Op& o : step.ops)
    if ((o.kind == OpKind::Send || o.kind == OpKind::Recv || o.kind == OpKind::RecvReduce) && !nccl_->carries(o.peer))
      rounds = std::max(rounds, chunks(static_cast<size_t>((o.kind == OpKind::Send ? o.src : o.dst).count) * esize));
  for (size_t i = 0; i < rounds; ++i) {
    for (const Op& o : step.ops) {  // chunk i of every send, then of every receive (see header)
      if (o.kind != OpKind::Send || nccl_->carries(o.peer)) continue;
      const size_t bytes = static_cast<size_t>(o.src.count) * esize;
      if (i >= chunks(bytes)) continue;
      const size_t off = i * chunk, n = std::min(chunk, bytes - std::min(bytes, off));
      send_chunk(o.peer, resolve(o.src) + (bytes ? off : 0), n, seq_, send_s);
    }
    for (const Op& o : step.ops) {
      if ((o.kind != OpKind::Recv && o.kind != OpKind::RecvReduce) || nccl_->carries(o.peer)) continue;
      const size_t bytes = static_cast<size_t>(o.dst.count) * esize;
      if (i >= chunks(bytes)) continue;
      const size_t off = i * chunk, n = std::min(chunk, bytes - std::min(bytes, off));
      char* d = resolve(o.dst);
      const char* src = reduces_from_src(o) ? resolve(o.src) : nullptr;
      recv_chunk(o.peer, d ? d + off : nullptr, src ? src + off : nullptr, n, o.kind == OpKind::RecvReduce, dtype, op,
                 seq_, s);
    }
  }
}

const StreamEngine::Plan& StreamEngine::plan(const CollectiveCall& call) {
  const uint64_t gen = tuning_generation();
  if (gen != tuning_generation_) {  // a new tuning table: auto may choose differently now
    plans_.clear();
    tuning_generation_ = gen;
  }
  const int root = collective_has_root(call.coll) ? call.root : 0;
  const ScheduleKey key{static_cast<uint8_t>(call.coll), call.algo, root, call.count};
  auto it = plans_.find(key);
  if (it != plans_.end()) return it->second;
  if (call.algo == kNcclAlgorithmCode) {  // NCCL's own collective: every peer takes part
    Plan p;
    p.algo = kNcclAlgorithmCode;
    for (int q = 0; q < size_; ++q)
      if (q != rank_) p.peers.push_back(q);
    if (plans_.size() >= 512) plans_.clear();
    return plans_.emplace(key, std::move(p)).first->second;
  }
  const auto names = algorithms(call.coll);
  if (call.algo > names.size()) throw std::invalid_argument("algorithm: index out of range");
  const int64_t bytes = call.count * static_cast<int64_t>(dtype_size(call.dtype));
  const std::string algo = call.algo ? names[call.algo - 1] : choose_algorithm(call.coll, "auto", bytes, size_);
  Plan p;
  p.sched = build_schedule(CollArgs{call.coll, rank_, size_, call.count, call.root}, algo);
  p.algo = static_cast<uint8_t>(algorithm_index(call.coll, algo));
  for (const Step& st : p.sched.steps)
    for (const Op& o : st.ops)
      if (o.peer >= 0 && std::find(p.peers.begin(), p.peers.end(), o.peer) == p.peers.end()) p.peers.push_back(o.peer);
  if (plans_.size() >= 512) plans_.clear();
  return plans_.emplace(key, std::move(p)).first->second;
}

CallDesc StreamEngine::describe(const CollectiveCall& call, uint8_t algo, uint64_t seq) const {
  CallDesc desc;
  desc.coll = static_cast<uint8_t>(call.coll);
  desc.dtype = static_cast<uint8_t>(call.dtype);
  desc.op = collective_reduces(call.coll) ? static_cast<uint8_t>(call.op) : 0;
  desc.algo = static_cast<uint8_t>(algo | kDeviceCallAlgoBit);
  desc.root = collective_has_root(call.coll) ? call.root : 0;
  desc.count = call.count;
  desc.seq = seq;
  return desc;
}

void StreamEngine::throw_if_failed_locked() {
  if (closed_) throw CommError("communicator is closed");
  if (!connected_) throw CommError("stream engine: not connected");
  if (failed()) {
    std::lock_guard<std::mutex> lk(mu_);
    throw_kind(fail_kind_, "communicator aborted: " + fail_message_);
  }
}

void StreamEngine::check_first_call(const CollectiveCall& call) {
  std::lock_guard<std::mutex> guard(enqueue_mu_);
  if (failed()) {
    std::lock_guard<std::mutex> lk(mu_);
    throw_kind(fail_kind_, "communicator aborted: " + fail_message_);
  }
  const CallDesc desc = describe(call, plan(call).algo, control_->peek_call_seq());
  control_->publish_call(desc);
  for (int p = 0; p < size_; ++p) {
    if (p == rank_) continue;
    const PeerStatus st = control_->peer_status(p, false);
    CallDesc pc;
    std::string msg;
    ErrorKind kind = ErrorKind::Mismatch;
    if (st.state == PeerState::Failed) {
      kind = st.kind == ErrorKind::None ? ErrorKind::Comm : st.kind;
      msg = "rank " + std::to_string(rank_) + " cannot start " + describe_call(desc) + ": rank " + std::to_string(p) +
            " failed: " + st.message;
    } else if (control_->peer_call(p, &pc) && pc.seq == desc.seq && pc != desc) {
      msg = "rank " + std::to_string(rank_) + " called " + describe_call(desc) + " but rank " + std::to_string(p) +
            " called " + describe_call(pc);
    }
    if (!msg.empty()) {
      fail(kind, msg);
      throw_kind(kind, msg);
    }
  }
}

std::shared_ptr<DeviceEvent> StreamEngine::begin(const CallDesc& desc, DeviceStream& s) {
  ++seq_;
  auto done = device_->create_event();
  {
    std::lock_guard<std::mutex> lk(mu_);
    in_flight_.push_back(InFlight{seq_, desc, done, false});
  }
  cv_.notify_all();
  if (last_done_) device_->wait_event(s, *last_done_);  // calls execute in call order
  return done;
}

std::shared_ptr<DeviceWork> StreamEngine::finish(std::shared_ptr<DeviceEvent> done, const std::string& enqueue_error,
                                                 DeviceStream& s) {
  device_->record(*done, s);
  {
    std::lock_guard<std::mutex> lk(mu_);
    for (auto it = in_flight_.rbegin(); it != in_flight_.rend(); ++it)
      if (it->seq == seq_) it->recorded = true;
  }
  last_done_ = done;
  if (!enqueue_error.empty()) throw CommError(enqueue_error);
  return std::make_shared<DeviceWork>(shared_from_this(), done, seq_);
}

std::shared_ptr<DeviceWork> StreamEngine::collective(const CollectiveCall& call, DeviceStream& s) {
  std::lock_guard<std::mutex> guard(enqueue_mu_);
  throw_if_failed_locked();
  const size_t esize = dtype_size(call.dtype);
  if (call.algo == kNcclAlgorithmCode) {  // algorithm="nccl": NCCL's own collective, no schedule
    NcclLink::check_supported(call.dtype, call.op, call.coll);
    if (!nccl_->ready()) throw CommError("algorithm='nccl': the NCCL communicator was not created");
  }
  const Plan& planned = plan(call);

  // Nothing above enqueued anything or took a number: a refused argument leaves the numbering
  // and the stream as they were. From here on the call is numbered (with the host calls).
  const CallDesc desc = describe(call, planned.algo, control_->next_call_seq());

  // A peer that failed earlier (its failure is on the control plane) fails this call at once.
  for (int p = 0; p < size_; ++p) {
    if (p == rank_) continue;
    const PeerStatus st = control_->peer_status(p, false);
    if (st.state == PeerState::Failed) {
      const std::string msg = "rank " + std::to_string(rank_) + " cannot start " + describe_call(desc) + ": rank " +
                              std::to_string(p) + " failed earlier: " + st.message;
      const ErrorKind kind = st.kind == ErrorKind::None ? ErrorKind::Comm : st.kind;
      fail(kind, msg);
      throw_kind(kind, msg);
    }
  }

  auto done = begin(desc, s);
  const std::vector<int> peers = planned.peers;
  if (!peers.empty()) device_->host_func([this, desc, peers] { check_call(desc, peers); }, s);
  std::string enqueue_error;
  try {
    enqueue_call(call, planned.sched, desc, esize, s);
  } catch (const std::exception& e) {
    // Partly enqueued: the ranks' counters no longer agree, so the engine cannot go on.
    enqueue_error = "rank " + std::to_string(rank_) + " could not enqueue " + describe_call(desc) + ": " + e.what();
    fail(ErrorKind::Comm, enqueue_error);
  }
  return finish(done, enqueue_error, s);
}

void StreamEngine::enqueue_call(const CollectiveCall& call, const Schedule& sched, const CallDesc& desc, size_t esize,
                                DeviceStream& s) {
  char* in = reinterpret_cast<char*>(call.input);
  char* out = reinterpret_cast<char*>(call.output);
  const bool owns_input = !((call.coll == Collective::Broadcast || call.coll == Collective::Scatter) && rank_ != call.root);
  if (call.op == RedOp::PremulSum && collective_reduces(call.coll) && owns_input) {
    const size_t n = static_cast<size_t>(input_elements(call.coll, call.count, size_));
    char* buf = grow(input_copy_, input_copy_bytes_, n * esize, s);
    if (n) device_->scale_copy(buf, in, n, call.dtype, call.scale, s);
    in = buf;
  } else if (call.coll == Collective::AllToAll && in == out && call.count) {
    const size_t n = static_cast<size_t>(call.count) * size_ * esize;
    char* buf = grow(input_copy_, input_copy_bytes_, n, s);
    device_->copy(buf, in, n, s);
    in = buf;
  }
  char* scr = sched.scratch_count ? grow(scratch_, scratch_bytes_, static_cast<size_t>(sched.scratch_count) * esize, s)
                                  : nullptr;
  char* const bases[3] = {in, out, scr};
  if (call.algo == kNcclAlgorithmCode) {  // NCCL sums what avg and premul_sum scale around it
    const bool scaled = call.op == RedOp::Avg || call.op == RedOp::PremulSum;
    nccl_->enqueue_collective(call, in, out, scaled ? RedOp::Sum : call.op, s);
  }
  if (opts_.streams == 1 || sched.steps.empty()) {
    for (const Step& st : sched.steps) enqueue_step(st, bases, esize, call.dtype, call.op, desc, s, s);
  } else {
    // Sends on one stream, local operations and receives on another, so a step's copies into
    // peers overlap its copies and reductions out of the inbox. Within a step they are
    // independent (a send waits only on its receiver's receives and the other way round, so no
    // deadlock); across steps each stream waits for the other's previous step (a step sends what
    // the previous one received, and receives into what it sent). wait_event takes the event's
    // latest record as of the call, so two events serve every step.
    DeviceStream& S = *send_stream_;
    DeviceStream& R = *recv_stream_;
    device_->record(*fork_, s);
    device_->wait_event(S, *fork_);
    device_->wait_event(R, *fork_);
    for (size_t k = 0; k < sched.steps.size(); ++k) {
      if (k) {
        device_->wait_event(S, *received_step_);
        device_->wait_event(R, *sent_step_);
      }
      enqueue_step(sched.steps[k], bases, esize, call.dtype, call.op, desc, S, R);
      device_->record(*sent_step_, S);
      device_->record(*received_step_, R);
    }
    device_->wait_event(s, *sent_step_);
    device_->wait_event(s, *received_step_);
  }
  if (call.op == RedOp::Avg && collective_reduces(call.coll) && (call.coll != Collective::Reduce || rank_ == call.root) &&
      call.count)
    device_->divide(out, static_cast<size_t>(call.count), call.dtype, size_, s);
}

void StreamEngine::close() {
  {
    std::lock_guard<std::mutex> guard(enqueue_mu_);
    if (closed_) return;
    closed_ = true;
  }
  if (last_done_) device_->synchronize(*last_done_);  // the watchdog releases a stuck stream
  nccl_->close();
  if (host_listener_) control_->remove_host_listener(host_listener_);
  host_listener_ = 0;
  {
    std::lock_guard<std::mutex> lk(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  if (watchdog_.joinable()) watchdog_.join();
  for (Peer& p : peers_) {
    if (p.inbox) device_->close_import(p.inbox);
    if (p.ctl) {
      device_->unmap_host(p.ctl);
      munmap(p.ctl, p.ctl_bytes);
    }
    p = Peer{};
  }
  device_->free_async(inbox_, *own_stream_);
  device_->free_async(scratch_, *own_stream_);
  device_->free_async(input_copy_, *own_stream_);
  device_->synchronize(*own_stream_);
  own_stream_.reset();  // its thread ends now, not when the last work handle goes
  send_stream_.reset();
  recv_stream_.reset();
  inbox_ = scratch_ = input_copy_ = nullptr;
  if (ctl_) {
    device_->unmap_host(ctl_);
    munmap(ctl_, ctl_bytes());
    ctl_ = nullptr;
  }
  if (ctl_fd_ >= 0) ::close(ctl_fd_);
  ctl_fd_ = -1;
}

}  // namespace commlib
