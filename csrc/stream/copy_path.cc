// The copy path (see copy_path.h): its control region and inbox, the chunks, a schedule's steps on
// one stream or two, and the call's descriptor check.
#include "stream/copy_path.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <exception>
#include <sstream>
#include <stdexcept>

#include "device/host_flags.h"
#include "plan/describe.h"
#include "plan/lowering.h"

namespace commlib {

namespace {

constexpr size_t kLine = 64;      // one counter per cache line: ranks write them concurrently
constexpr uint64_t kRing = 64;    // call descriptors kept per rank
constexpr size_t kRingSlot = 64;  // bytes per descriptor slot: seq (written last), CallDesc
constexpr size_t kP2PSlot = 64;   // seq (written last), CallDesc
constexpr int kFlagKinds = 3;     // ready, freed, called
constexpr uint64_t kReleased = uint64_t{1} << 62;  // above any counter a stream waits for

std::atomic<uint64_t>& seq_word(char* slot) { return *reinterpret_cast<std::atomic<uint64_t>*>(slot); }

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

// Control region: three counter lines per peer, the call-descriptor ring, the point-to-point
// descriptor rings, the stop word's line.
size_t CopyPath::ctl_bytes() const {
  return kFlagKinds * static_cast<size_t>(size_) * kLine + kRing * kRingSlot +
         static_cast<size_t>(size_) * kP2PRing * kP2PSlot + kLine;
}

uint64_t* CopyPath::flag(char* ctl, int which, int peer) const {
  return reinterpret_cast<uint64_t*>(ctl + (static_cast<size_t>(which) * size_ + peer) * kLine);
}

char* CopyPath::ring_slot(char* ctl, uint64_t seq) const {
  return ctl + kFlagKinds * static_cast<size_t>(size_) * kLine + (seq % kRing) * kRingSlot;
}

static size_t p2p_offset(int size, int peer, uint64_t k, uint64_t ring) {
  return kFlagKinds * static_cast<size_t>(size) * kLine + kRing * kRingSlot +
         (static_cast<size_t>(peer) * ring + k % ring) * kP2PSlot;
}

char* CopyPath::p2p_slot(int peer, uint64_t k, bool dev) const {
  return (dev ? dev_ctl() : ctl_) + p2p_offset(size_, peer, k, kP2PRing);
}

char* CopyPath::peer_p2p_slot(int peer, uint64_t k) const {
  return peers_[peer].ctl + p2p_offset(size_, rank_, k, kP2PRing);
}

uint64_t* CopyPath::stop_word(char* ctl) const { return reinterpret_cast<uint64_t*>(ctl + ctl_bytes() - kLine); }
const uint64_t* CopyPath::stop_dev() const { return stop_word(dev_ctl()); }

CopyPath::CopyPath(std::shared_ptr<Device> device, CopyPathHost& host, NcclLink& nccl, int rank, int size,
                   uint32_t nslots, uint64_t slot_bytes, int streams)
    : device_(std::move(device)),
      host_(host),
      nccl_(nccl),
      rank_(rank),
      size_(size),
      nslots_(nslots),
      slot_bytes_(slot_bytes),
      streams_(streams),
      data_ops_(data_ops_from_env()),
      peers_(size),
      grouped_(size, false),
      remote_(size, false),
      sent_(size, 0),
      received_(size, 0) {
  for (int p = 0; p < size_; ++p)
    if (p != rank_) others_.push_back(p);
  ctl_fd_ = memfd_create("commlib-device-ctl", MFD_CLOEXEC);
  if (ctl_fd_ < 0 || ftruncate(ctl_fd_, static_cast<off_t>(ctl_bytes())) != 0)
    throw std::runtime_error(std::string("stream engine: control region: ") + std::strerror(errno));
  void* p = mmap(nullptr, ctl_bytes(), PROT_READ | PROT_WRITE, MAP_SHARED, ctl_fd_, 0);
  if (p == MAP_FAILED) throw std::runtime_error(std::string("stream engine: mmap: ") + std::strerror(errno));
  ctl_ = static_cast<char*>(p);
  ctl_dev_ = device_->map_host(ctl_, ctl_bytes());
  const size_t inbox_bytes = static_cast<size_t>(size_) * nslots_ * slot_bytes_;
  inbox_ = device_->allocate(inbox_bytes + (data_ops_ == DataOps::Mirror ? kMirrors * sizeof(uint64_t) : 0));
  if (data_ops_ == DataOps::Mirror) mirrors_ = reinterpret_cast<uint64_t*>(static_cast<char*>(inbox_) + inbox_bytes);
  if (streams_ == 2) {
    send_stream_ = device_->create_stream();
    recv_stream_ = device_->create_stream();
    fork_ = device_->create_event();
    sent_step_ = device_->create_event();
    received_step_ = device_->create_event();
  }
}

CopyPath::~CopyPath() {
  try {
    DeviceGuard guard(*device_);  // the last reference may go on any thread (issue #23: no stray context)
    close_imports();
    release();
  } catch (...) {
  }
}

std::string CopyPath::local_handle() const {
  return "ctl:" + std::to_string(getpid()) + ":" + std::to_string(ctl_fd_) + ":" + std::to_string(ctl_bytes()) +
         ";slots:" + std::to_string(nslots_) + ":" + std::to_string(slot_bytes_) +
         ";inbox:" + device_->export_memory(inbox_);
}

std::vector<uint64_t> CopyPath::check_peer_handle(int p, const std::string& h, std::string* inbox) const {
  const size_t a = h.find(";slots:"), b = h.find(";inbox:");
  if (h.rfind("ctl:", 0) != 0 || a == std::string::npos || b == std::string::npos || b < a)
    throw std::invalid_argument("stream engine: malformed handle of rank " + std::to_string(p));
  std::vector<uint64_t> ctl = parse_fields(h.substr(4, a - 4), 3, "control handle of rank " + std::to_string(p));
  auto slots = parse_fields(h.substr(a + 7, b - a - 7), 2, "slot settings of rank " + std::to_string(p));
  if (slots[0] != nslots_ || slots[1] != slot_bytes_)
    throw std::invalid_argument("COMMLIB_DEVICE_SLOTS/COMMLIB_DEVICE_SLOT_BYTES: rank " + std::to_string(p) + " uses " +
                                std::to_string(slots[0]) + " x " + std::to_string(slots[1]) + " bytes, rank " +
                                std::to_string(rank_) + " " + std::to_string(nslots_) + " x " +
                                std::to_string(slot_bytes_) + "; every rank must use the same");
  if (ctl[2] != ctl_bytes()) throw std::invalid_argument("stream engine: rank " + std::to_string(p) + " has another world size");
  *inbox = h.substr(b + 7);
  return ctl;
}

void CopyPath::map_peer(int p, const std::vector<uint64_t>& ctl, const std::string& inbox) {
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
  peers_[p].ctl_dev = device_->map_host(m, ctl_bytes());
  peers_[p].inbox = static_cast<char*>(device_->import_memory(inbox));
}

void CopyPath::set_links(std::vector<bool> grouped, std::vector<bool> remote) {
  grouped_ = std::move(grouped);
  remote_ = std::move(remote);
}

int CopyPath::mapped_peers() const {
  int n = 0;
  for (const Peer& p : peers_) n += p.ctl != nullptr;
  return n;
}

// -- chunks and steps -------------------------------------------------------------------------

void CopyPath::send_chunk(int p, const char* src, size_t bytes, uint64_t seq, DeviceStream& s) {
  const uint64_t c = sent_[p]++;
  if (c >= nslots_) {
    const uint64_t target = c - nslots_ + 1;
    host_.note_wait(StreamWait{flag(ctl_, 1, p), target, p, true, seq});
    device_->wait_value(flag(dev_ctl(), 1, p), target, s);
  }
  char* slot = peers_[p].inbox + (static_cast<size_t>(rank_) * nslots_ + c % nslots_) * slot_bytes_;
  if (bytes) device_->copy(slot, src, bytes, s);  // into the peer's inbox: its gated receive takes it or not
  device_->write_value(flag(reinterpret_cast<char*>(peers_[p].ctl_dev), 0, rank_), c + 1, s);
}

void CopyPath::recv_chunk(int q, char* dst, const char* src, size_t bytes, bool reduce, DType dtype, RedOp op,
                          uint64_t seq, DeviceStream& s) {
  const uint64_t c = received_[q]++;
  host_.note_wait(StreamWait{flag(ctl_, 0, q), c + 1, q, false, seq});
  device_->wait_value(flag(dev_ctl(), 0, q), c + 1, s);
  const char* slot = static_cast<char*>(inbox_) + (static_cast<size_t>(q) * nslots_ + c % nslots_) * slot_bytes_;
  if (bytes) {  // skipped once the call's check failed or the engine failed (the stop word)
    if (!reduce) {
      data_copy(dst, slot, bytes, s);
    } else {
      if (src && src != dst) data_copy(dst, src, bytes, s);
      data_reduce(dst, slot, bytes / dtype_size(dtype), dtype, op, s);
    }
  }
  device_->write_value(flag(reinterpret_cast<char*>(peers_[q].ctl_dev), 1, rank_), c + 1, s);
}

Launched CopyPath::enqueue(const PathCall& pc, DeviceStream& s) {
  // compress_inter_only codes messages between hosts only: on one host such a call is the plain
  // one, as on the host executor.
  if (runs_encoded(pc.call.codec)) return enqueue_compressed(pc, s);
  const Schedule& sched = pc.plan.device_sched();  // a laned list's rounds merged (kernels/device_list.h)
  const CollectiveCall& call = pc.call;
  const size_t esize = dtype_size(call.dtype);
  if (streams_ == 1 || sched.steps.empty()) {
    for (const Step& st : sched.steps) enqueue_step(st, pc.bases, esize, call.dtype, call.op, pc.desc, pc.seq, s, s);
    return Launched{};
  }
  // Sends on one stream, local operations and receives on another, so a step's copies into peers
  // overlap its copies and reductions out of the inbox. Within a step they are independent (a send
  // waits only on its receiver's receives and the other way round, so no deadlock); across steps
  // each stream waits for the other's previous step (a step sends what the previous one received,
  // and receives into what it sent). wait_event takes the event's latest record as of the call, so
  // two events serve every step.
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
    enqueue_step(sched.steps[k], pc.bases, esize, call.dtype, call.op, pc.desc, pc.seq, S, R);
    device_->record(*sent_step_, S);
    device_->record(*received_step_, R);
  }
  device_->wait_event(s, *sent_step_);
  device_->wait_event(s, *received_step_);
  return Launched{};
}

void CopyPath::enqueue_step(const Step& step, char* const bases[3], size_t esize, DType dtype, RedOp op,
                            const CallDesc& desc, uint64_t seq, DeviceStream& send_s, DeviceStream& s) {
  auto resolve = [&](const Region& r) { return region_address(bases, r, esize, desc, rank_); };
  // Local operations first: the schedule guarantees they touch nothing the messages touch.
  for (const Op& o : step.ops) {
    const size_t bytes = static_cast<size_t>((o.kind == OpKind::Send ? o.src : o.dst).count) * esize;
    if (o.kind == OpKind::Copy && bytes) {
      char* d = resolve(o.dst);
      const char* src = resolve(o.src);
      if (d != src) data_copy(d, src, bytes, s);
    } else if (o.kind == OpKind::Reduce && bytes) {
      data_reduce(resolve(o.dst), resolve(o.src), bytes / esize, dtype, op, s);
    }
  }
  // Messages to peers over the nccl link: one NCCL group, before the peer-memory chunks.
  if (nccl_.carries_any()) nccl_.enqueue_step(step, resolve, esize, dtype, op, s);  // its grouped() peers
  const size_t chunk = std::max<size_t>(slot_bytes_ / esize * esize, esize);
  auto chunks = [&](size_t bytes) { return bytes ? (bytes + chunk - 1) / chunk : 1; };
  size_t rounds = 0;
  for (const Op& o : step.ops)
    if ((o.kind == OpKind::Send || o.kind == OpKind::Recv || o.kind == OpKind::RecvReduce) && !grouped(o.peer))
      rounds = std::max(rounds, chunks(static_cast<size_t>((o.kind == OpKind::Send ? o.src : o.dst).count) * esize));
  for (size_t i = 0; i < rounds; ++i) {
    for (const Op& o : step.ops) {  // chunk i of every send, then of every receive (see header)
      if (o.kind != OpKind::Send || grouped(o.peer)) continue;
      const size_t bytes = static_cast<size_t>(o.src.count) * esize;
      if (i >= chunks(bytes)) continue;
      const size_t off = i * chunk, n = std::min(chunk, bytes - std::min(bytes, off));
      send_chunk(o.peer, resolve(o.src) + (bytes ? off : 0), n, seq, send_s);
    }
    for (const Op& o : step.ops) {
      if ((o.kind != OpKind::Recv && o.kind != OpKind::RecvReduce) || grouped(o.peer)) continue;
      const size_t bytes = static_cast<size_t>(o.dst.count) * esize;
      if (i >= chunks(bytes)) continue;
      const size_t off = i * chunk, n = std::min(chunk, bytes - std::min(bytes, off));
      char* d = resolve(o.dst);
      const char* src = reduces_from_src(o) ? resolve(o.src) : nullptr;
      recv_chunk(o.peer, d ? d + off : nullptr, src ? src + off : nullptr, n, o.kind == OpKind::RecvReduce, dtype, op,
                 seq, s);
    }
  }
}

// -- the call's descriptor check --------------------------------------------------------------

void CopyPath::enqueue_call_check(const CallDesc& desc, uint64_t seq, DeviceStream& s) {
  device_->host_func([this, desc] { publish_call_desc(desc); }, s);
  // Against every rank, not only the schedule's peers: then every rank of a mismatched call finds
  // it and skips its data steps (a rank whose peers all agree with it would otherwise take what a
  // rank that stopped never sent: stale bytes of an earlier call). Peers that never arrive (dead,
  // failed, silent) are the watchdog's to judge: failing raises this rank's `called` words.
  for (int p : others_) {
    if (remote(p)) continue;  // its descriptor comes over NCCL (remote_descriptors.*)
    host_.note_wait(StreamWait{flag(ctl_, 2, p), desc.seq, p, false, seq, WaitFor::CallDesc});
    device_->wait_value(flag(dev_ctl(), 2, p), desc.seq, s);
  }
  device_->host_func([this, desc, seq] { compare_call_desc(desc, seq); }, s);
}

void CopyPath::publish_call_desc(const CallDesc& desc) {
  host_.publish_call(desc);  // where host calls look (a host call of this number is a mismatch)
  char* mine = ring_slot(ctl_, desc.seq);
  std::memcpy(mine + 8, &desc, sizeof desc);
  store_flag(reinterpret_cast<uint64_t*>(mine), desc.seq);
  for (int p : others_)  // after the slot: a peer whose `called` word passed reads a written slot
    if (!remote(p)) store_flag(flag(peers_[p].ctl, 2, rank_), desc.seq);
}

void CopyPath::compare_call_desc(const CallDesc& desc, uint64_t seq) {
  for (int p : others_) {
    if (remote(p)) continue;
    char* theirs = ring_slot(peers_[p].ctl, desc.seq);
    const uint64_t s = seq_word(theirs).load(std::memory_order_acquire);
    if (s < desc.seq) return;  // released by a failure: the peer never published this call
    CallDesc pd;
    std::memcpy(&pd, theirs + 8, sizeof pd);
    if (s > desc.seq) pd.seq = s;  // the peer is past this call: the slot holds its later call #s
    if (pd != desc) {
      stop_data();  // the data steps after this host function skip (the stream goes on at once)
      return host_.fail_from_stream(ErrorKind::Mismatch, mismatch_message(rank_, desc, p, pd), seq);
    }
  }
}

// -- failure and release ----------------------------------------------------------------------

void CopyPath::stop_data() {
  if (ctl_) store_flag(stop_word(ctl_), 1);
}

void CopyPath::release_waits() {
  if (!ctl_) return;
  stop_data();  // before any wait passes: what runs on after a release writes nothing
  for (int p = 0; p < size_; ++p)
    for (int which = 0; which < kFlagKinds; ++which) store_flag(flag(ctl_, which, p), kReleased);
}

// Every step is tried (a device error in one leaves nothing mapped here); the first error is thrown
// after (the engine fails with it).
template <class Fn>
static void try_step(std::exception_ptr* first, Fn&& fn) {
  try {
    fn();
  } catch (...) {
    if (!*first) *first = std::current_exception();
  }
}

void CopyPath::close_imports() {
  std::exception_ptr first;
  for (Peer& p : peers_) {
    if (p.inbox) try_step(&first, [&] { device_->close_import(p.inbox); });
    if (p.ctl) {
      try_step(&first, [&] { device_->unmap_host(p.ctl); });
      munmap(p.ctl, ctl_bytes());
    }
    p = Peer{};
  }
  if (first) std::rethrow_exception(first);
}

void CopyPath::free_inbox(DeviceStream& stream) {
  if (inbox_) device_->free_async(inbox_, stream);
  inbox_ = nullptr;
}

void CopyPath::release() {
  inbox_ = nullptr;  // freed by free_inbox, or left allocated (a peer may still map it)
  send_stream_.reset();
  recv_stream_.reset();
  std::exception_ptr first;
  if (ctl_) {
    try_step(&first, [&] { device_->unmap_host(ctl_); });
    munmap(ctl_, ctl_bytes());
    ctl_ = nullptr;
  }
  if (ctl_fd_ >= 0) ::close(ctl_fd_);
  ctl_fd_ = -1;
  if (first) std::rethrow_exception(first);
}

}  // namespace commlib
