#include "transport/shm/shm.h"

#include "common/params.h"
#include "transport/shm/shm_layout.h"
#include "transport/shm/shm_region.h"

#include <linux/futex.h>
#include <sched.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <sys/uio.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <new>
#include <string>
#include <thread>

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define COMMLIB_PAUSE() _mm_pause()
#else
#define COMMLIB_PAUSE() std::this_thread::yield()
#endif

namespace commlib {

namespace {

int futex_wait(std::atomic<uint32_t>* addr, uint32_t expected, int64_t timeout_us) {
  struct timespec ts;
  ts.tv_sec = timeout_us / 1000000;
  ts.tv_nsec = (timeout_us % 1000000) * 1000;
  // Not FUTEX_PRIVATE: the word lives in memory shared between processes.
  return static_cast<int>(syscall(SYS_futex, reinterpret_cast<uint32_t*>(addr), FUTEX_WAIT, expected, &ts,
                                  nullptr, 0));
}

void futex_wake(std::atomic<uint32_t>* addr) {
  syscall(SYS_futex, reinterpret_cast<uint32_t*>(addr), FUTEX_WAKE, INT32_MAX, nullptr, nullptr, 0);
}

}  // namespace

uint64_t shm_default_slot_bytes(int size) {
  // Up to 256 KiB chunks (large enough to amortise the hand-off, small enough to stay in cache
  // between the sender's copy and the receiver's reduce), with at most ~64 MiB of channels.
  const uint64_t budget = 64ull << 20;
  uint64_t pairs = size > 1 ? static_cast<uint64_t>(size) * (size - 1) : 1;
  uint64_t per = budget / pairs / 4;
  per = std::min<uint64_t>(per, 256 << 10);
  per = std::max<uint64_t>(per, 4 << 10);
  return per / 4096 * 4096;
}

uint64_t shm_default_stream_bytes(int size) {
  const uint64_t budget = 16ull << 20;
  uint64_t per = std::min<uint64_t>(budget / static_cast<uint64_t>(std::max(size, 1)), 4ull << 20);
  return std::max<uint64_t>(per / (64 << 10) * (64 << 10), 64 << 10);
}

ShmConfig shm_config_from_env(int size) {
  ShmConfig cfg;
  cfg.nslots = static_cast<uint32_t>(param_int("COMMLIB_SHM_SLOTS"));
  cfg.slot_bytes = static_cast<uint64_t>(param_bytes("COMMLIB_SHM_SLOT_BYTES"));
  if (cfg.slot_bytes == 0) cfg.slot_bytes = shm_default_slot_bytes(size);
  if (cfg.slot_bytes < 64 || cfg.slot_bytes % 64)
    throw std::invalid_argument("COMMLIB_SHM_SLOT_BYTES: must be a multiple of 64, at least 64");
  cfg.stream_bytes = static_cast<uint64_t>(param_bytes("COMMLIB_SHM_BCAST_BYTES"));
  if (cfg.stream_bytes == 0) cfg.stream_bytes = shm_default_stream_bytes(size);
  if (cfg.stream_bytes < 256 || cfg.stream_bytes % 64)
    throw std::invalid_argument("COMMLIB_SHM_BCAST_BYTES: must be a multiple of 64, at least 256");
  cfg.spin_us = spin_us_param();
  return cfg;
}

static size_t ctl_stride() { return round_up(sizeof(ShmTransport::RankCtl), kLine); }
// A rank's stream: its produced line, a consumed line per rank, then the ring.
static size_t stream_stride(int size, uint64_t stream_bytes) {
  return (1 + static_cast<size_t>(size)) * kLine + round_up(stream_bytes, kLine);
}

uint64_t shm_region_bytes(int size, const ShmConfig& cfg) {
  size_t slot_stride = round_up(sizeof(ChunkHeader), kLine) + round_up(cfg.slot_bytes, kLine);
  size_t channel_stride = round_up(sizeof(ShmTransport::ChannelCtl), kLine) + cfg.nslots * slot_stride;
  return round_up(sizeof(RegionHeader), kLine) + size * ctl_stride() +
         static_cast<uint64_t>(size) * size * channel_stride + size * stream_stride(size, cfg.stream_bytes);
}

ShmTransport::ShmTransport(int rank, int size, int fd, const ShmConfig& cfg) : rank_(rank), size_(size) {
  // Every rank computes the layout itself and checks the region against it before mapping it:
  // the descriptor and rank 0's header come from another process and are not trusted.
  const uint64_t expected = shm_region_bytes(size, cfg);
  check_region_fd(fd, expected);
  void* head = mmap(nullptr, 4096, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (head == MAP_FAILED) throw CommError(std::string("shm: mmap failed: ") + std::strerror(errno));
  auto* rh = static_cast<RegionHeader*>(head);
  const uint32_t nslots = cfg.nslots;
  const uint64_t slot_bytes = cfg.slot_bytes;
  if (rank == 0) {
    rh->size = static_cast<uint32_t>(size);
    rh->nslots = nslots;
    rh->slot_bytes = slot_bytes;
    rh->stream_bytes = cfg.stream_bytes;
    rh->magic.store(kMagic, std::memory_order_release);
  } else {
    std::string bad;
    if (rh->magic.load(std::memory_order_acquire) != kMagic)
      bad = "shm: region not initialised by rank 0 (bad magic)";
    else if (rh->size != static_cast<uint32_t>(size))
      bad = "shm: world size " + std::to_string(size) + " differs from rank 0's " + std::to_string(rh->size);
    else if (rh->nslots != nslots || rh->slot_bytes != slot_bytes || rh->stream_bytes != cfg.stream_bytes)
      bad = "shm: rank 0's region header says " + std::to_string(rh->nslots) + " slots of " +
            std::to_string(rh->slot_bytes) + " bytes and " + std::to_string(rh->stream_bytes) +
            "-byte streams but rank " + std::to_string(rank) + " computed " + std::to_string(nslots) + " of " +
            std::to_string(slot_bytes) + " and " + std::to_string(cfg.stream_bytes) +
            " (COMMLIB_SHM_SLOTS / COMMLIB_SHM_SLOT_BYTES / COMMLIB_SHM_BCAST_BYTES must be the same on every rank)";
    if (!bad.empty()) {
      munmap(head, 4096);
      throw CommError(bad);
    }
  }
  munmap(head, 4096);

  nslots_ = nslots;
  slot_bytes_ = slot_bytes;
  bytes_ = expected;
  slot_stride_ = round_up(sizeof(ChunkHeader), kLine) + round_up(slot_bytes, kLine);
  channel_stride_ = round_up(sizeof(ChannelCtl), kLine) + nslots * slot_stride_;
  ctl_offset_ = round_up(sizeof(RegionHeader), kLine);
  chan_offset_ = ctl_offset_ + size * ctl_stride();
  stream_bytes_ = cfg.stream_bytes;
  stream_stride_ = stream_stride(size, stream_bytes_);
  stream_offset_ = chan_offset_ + static_cast<size_t>(size) * size * channel_stride_;

  void* p = mmap(nullptr, bytes_, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (p == MAP_FAILED) throw CommError(std::string("shm: mmap of the region failed: ") + std::strerror(errno));
  base_ = static_cast<char*>(p);

  // The region is zero-filled by ftruncate; atomics with all-zero bytes are valid zero values.
  RankCtl& me = ctl(rank_);
  me.region_address.store(reinterpret_cast<uint64_t>(base_), std::memory_order_relaxed);
  me.pid.store(static_cast<int32_t>(getpid()), std::memory_order_relaxed);
  me.state.store(static_cast<uint32_t>(PeerState::Alive), std::memory_order_release);

  int ncores = static_cast<int>(std::thread::hardware_concurrency());
  // Spin about as long as a peer's reply takes to arrive (a futex round trip costs more), then
  // sleep. Oversubscribed ranks spin by yielding only, so the peer they wait for gets the core.
  oversubscribed_ = size > ncores;
  flags_ = make_shm_flags(*this);
  spin_us_ = cfg.spin_us >= 0 ? cfg.spin_us : kDefaultSpinUs;
}

ShmTransport::~ShmTransport() {
  close();
  if (base_) munmap(base_, bytes_);
}

ShmTransport::RankCtl& ShmTransport::ctl(int r) const {
  return *reinterpret_cast<RankCtl*>(base_ + ctl_offset_ + r * ctl_stride());
}

ShmTransport::ChannelCtl& ShmTransport::channel(int src, int dst) const {
  return *reinterpret_cast<ChannelCtl*>(base_ + chan_offset_ + (static_cast<size_t>(src) * size_ + dst) * channel_stride_);
}

std::atomic<uint64_t>& ShmTransport::stream_produced(int r) const {
  return *reinterpret_cast<std::atomic<uint64_t>*>(base_ + stream_offset_ + r * stream_stride_);
}

std::atomic<uint64_t>& ShmTransport::stream_consumed(int r, int reader) const {
  return *reinterpret_cast<std::atomic<uint64_t>*>(base_ + stream_offset_ + r * stream_stride_ + (1 + reader) * kLine);
}

char* ShmTransport::stream_data(int r) const {
  return base_ + stream_offset_ + r * stream_stride_ + (1 + static_cast<size_t>(size_)) * kLine;
}

char* ShmTransport::slot(int src, int dst, uint64_t index) const {
  return reinterpret_cast<char*>(&channel(src, dst)) + round_up(sizeof(ChannelCtl), kLine) +
         (index % nslots_) * slot_stride_;
}

void ShmTransport::ring(int peer) {
  RankCtl& c = ctl(peer);
  c.doorbell.fetch_add(1, std::memory_order_seq_cst);
  if (c.sleeping.load(std::memory_order_seq_cst)) futex_wake(&c.doorbell);
}

ShmLink::ShmLink(ShmTransport& t, int peer)
    : t_(t),
      peer_(peer),
      out_(t.channel(t.rank_, peer)),
      in_(t.channel(peer, t.rank_)),
      out_slots_(t.slot(t.rank_, peer, 0)),
      in_slots_(t.slot(peer, t.rank_, 0)),
      peer_ctl_(t.ctl(peer)) {}

std::unique_ptr<Link> ShmTransport::make_link(int peer) {
  if (peer < 0 || peer >= size_ || peer == rank_) throw std::invalid_argument("shm: no link to domain rank " + std::to_string(peer));
  return std::make_unique<ShmLink>(*this, peer);
}

LinkCaps ShmLink::query_caps() const {
  LinkCaps c;
  c.chunk_bytes = t_.chunk_bytes();
  c.channel_bytes = t_.channel_bytes();
  c.accepts_rendezvous = t_.direct_reads();
  c.peer_reads_flag = &peer_ctl_.reads_directly;
  return c;
}

ChunkHeader* ShmLink::acquire_send(char** payload) {
  uint64_t t = out_.tail.load(std::memory_order_relaxed);
  uint64_t h = out_.head.load(std::memory_order_acquire);
  if (t - h >= t_.nslots_) return nullptr;
  char* s = out_slots_ + (t % t_.nslots_) * t_.slot_stride_;
  *payload = s + round_up(sizeof(ChunkHeader), kLine);
  return reinterpret_cast<ChunkHeader*>(s);
}

void ShmLink::publish_send() {
  out_.tail.store(out_.tail.load(std::memory_order_relaxed) + 1, std::memory_order_release);
  t_.ring(peer_);
}

const ChunkHeader* ShmLink::peek_recv(const char** payload) {
  uint64_t h = in_.head.load(std::memory_order_relaxed);
  if (in_.tail.load(std::memory_order_acquire) == h) return nullptr;
  const char* s = in_slots_ + (h % t_.nslots_) * t_.slot_stride_;
  *payload = s + round_up(sizeof(ChunkHeader), kLine);
  return reinterpret_cast<const ChunkHeader*>(s);
}

void ShmLink::release_recv() {
  in_.head.store(in_.head.load(std::memory_order_relaxed) + 1, std::memory_order_release);
  t_.ring(peer_);
}

uint32_t ShmTransport::events() { return ctl(rank_).doorbell.load(std::memory_order_acquire); }

void ShmTransport::wait_events(uint32_t seen, int64_t timeout_us) {
  RankCtl& c = ctl(rank_);
  if (spin_us_ > 0) {
    // Spin, offering the core between rounds: when the peer we wait for shares our core (more
    // ranks than free cores), pure spinning would hold it off for the whole spin (measured: 120 us
    // instead of 4 us per 2-rank all_reduce with both ranks on one core). Oversubscribed ranks
    // only yield; others pause-spin and yield every 256 pauses.
    const int pauses = oversubscribed_ ? 0 : 256;
    auto until = std::chrono::steady_clock::now() + std::chrono::microseconds(spin_us_);
    for (;;) {
      for (int i = 0; i < pauses; ++i) {
        if (c.doorbell.load(std::memory_order_acquire) != seen) return;
        COMMLIB_PAUSE();
      }
      sched_yield();
      if (c.doorbell.load(std::memory_order_acquire) != seen) return;
      if (std::chrono::steady_clock::now() > until) break;
    }
  }
  c.sleeping.store(1, std::memory_order_seq_cst);
  if (c.doorbell.load(std::memory_order_seq_cst) == seen) futex_wait(&c.doorbell, seen, timeout_us);
  c.sleeping.store(0, std::memory_order_relaxed);
}

static bool process_dead(int pid) {
  if (pid <= 0) return false;
  std::ifstream f("/proc/" + std::to_string(pid) + "/stat");
  if (!f) return true;
  std::string line;
  std::getline(f, line);
  size_t close_paren = line.rfind(')');
  if (close_paren == std::string::npos || close_paren + 2 >= line.size()) return false;
  char state = line[close_paren + 2];
  return state == 'Z' || state == 'X';
}

PeerStatus ShmTransport::peer_status(int peer, bool check_process) {
  RankCtl& c = ctl(peer);
  PeerStatus st;
  st.state = static_cast<PeerState>(c.state.load(std::memory_order_acquire));
  if (st.state == PeerState::Failed) {
    st.kind = static_cast<ErrorKind>(c.error_kind.load(std::memory_order_relaxed));
    st.message.assign(c.error_message, strnlen(c.error_message, kMaxMessage));
  } else if (check_process && st.state == PeerState::Alive && process_dead(c.pid.load(std::memory_order_relaxed))) {
    st.state = PeerState::Dead;
  }
  return st;
}

bool ShmTransport::peer_failed(int peer) {
  return ctl(peer).state.load(std::memory_order_acquire) == static_cast<uint32_t>(PeerState::Failed);
}

void ShmTransport::publish_failure(ErrorKind kind, const std::string& message) {
  RankCtl& me = ctl(rank_);
  if (me.state.load(std::memory_order_relaxed) == static_cast<uint32_t>(PeerState::Failed)) return;
  size_t n = std::min(message.size(), kMaxMessage - 1);
  std::memcpy(me.error_message, message.data(), n);
  me.error_message[n] = 0;
  me.error_kind.store(static_cast<uint32_t>(kind), std::memory_order_relaxed);
  me.state.store(static_cast<uint32_t>(PeerState::Failed), std::memory_order_release);
  for (int r = 0; r < size_; ++r)
    if (r != rank_) ring(r);
}

void ShmTransport::publish_call(const CallDesc& d) {
  RankCtl& me = ctl(rank_);
  uint64_t v = me.call_version.load(std::memory_order_relaxed);
  me.call_version.store(v + 1, std::memory_order_relaxed);
  std::atomic_thread_fence(std::memory_order_release);
  me.call = d;
  me.call_version.store(v + 2, std::memory_order_release);
}

bool ShmTransport::peer_call(int peer, CallDesc* d) {
  RankCtl& c = ctl(peer);
  for (int attempt = 0; attempt < 16; ++attempt) {
    uint64_t v1 = c.call_version.load(std::memory_order_acquire);
    if (v1 == 0) return false;
    if (v1 & 1) continue;
    CallDesc copy = c.call;
    std::atomic_thread_fence(std::memory_order_acquire);
    if (c.call_version.load(std::memory_order_relaxed) == v1) {
      *d = copy;
      return true;
    }
  }
  return false;
}

int ShmTransport::peer_pid(int peer) { return ctl(peer).pid.load(std::memory_order_relaxed); }

void ShmTransport::close() {
  if (closed_ || !base_) return;
  closed_ = true;
  RankCtl& me = ctl(rank_);
  uint32_t expected = static_cast<uint32_t>(PeerState::Alive);
  me.state.compare_exchange_strong(expected, static_cast<uint32_t>(PeerState::Closed), std::memory_order_acq_rel);
  for (int r = 0; r < size_; ++r)
    if (r != rank_) ring(r);
}

}  // namespace commlib
