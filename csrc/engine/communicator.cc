#include "engine/communicator.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "common/describe.h"
#include "engine/misuse.h"
#include "kernels/cpu_reduce.h"
#include "schedule/registry.h"

namespace commlib {

namespace {

using Clock = std::chrono::steady_clock;

char* aligned_alloc_bytes(size_t bytes) {
  void* p = nullptr;
  if (posix_memalign(&p, 64, bytes ? bytes : 64)) throw std::bad_alloc();
  return static_cast<char*>(p);
}

// Elements of the input buffer for one rank of a collective with per-call `count`.
int64_t input_elements(Collective c, int64_t count, int size) {
  switch (c) {
    case Collective::ReduceScatter:
    case Collective::AllToAll:
    case Collective::Scatter:
      return count * size;
    default:
      return count;
  }
}

// A byte count from the environment (unset: `fallback`); anything but digits is an error naming it.
size_t env_bytes(const char* name, size_t fallback) {
  const char* v = std::getenv(name);
  if (!v) return fallback;
  char* end = nullptr;
  long long b = std::strtoll(v, &end, 10);
  if (!*v || *end || b < 0) throw std::invalid_argument(std::string(name) + ": expected a byte count >= 0, got '" + v + "'");
  return static_cast<size_t>(b);
}

ExecOptions exec_options(const CommOptions& opts) {
  ExecOptions e;
  e.timeout_s = opts.timeout_s;
  e.stream_bytes = env_bytes("COMMLIB_STREAM_BYTES", e.stream_bytes);
  e.copy_chunk_bytes = env_bytes("COMMLIB_COPY_CHUNK_BYTES", e.copy_chunk_bytes);
  return e;
}

// Elements of the output buffer of one rank (the root's, for rooted collectives).
int64_t output_elements(Collective c, int64_t count, int size) {
  switch (c) {
    case Collective::AllGather:
    case Collective::AllToAll:
    case Collective::Gather:
      return count * size;
    default:
      return count;
  }
}

}  // namespace

bool Work::wait(double timeout_s) {
  if (!done_.load(std::memory_order_acquire)) {
    std::unique_lock<std::mutex> lk(mu_);
    auto ready = [&] { return done_.load(std::memory_order_acquire); };
    if (timeout_s < 0)
      cv_.wait(lk, ready);
    else if (!cv_.wait_for(lk, std::chrono::duration<double>(timeout_s), ready))
      return false;
  }
  if (error_) std::rethrow_exception(error_);
  return true;
}

void Work::run() {
  try {
    job_();
  } catch (...) {
    error_ = std::current_exception();
  }
  job_ = nullptr;
  {
    std::lock_guard<std::mutex> lk(mu_);
    done_.store(true, std::memory_order_release);
  }
  cv_.notify_all();
}

Communicator::Communicator(std::unique_ptr<Fabric> transport, CommOptions opts)
    : transport_(std::move(transport)),
      topology_(transport_->topology()),
      exec_(*transport_, exec_options(opts)),
      opts_(std::move(opts)),
      rank_(transport_->rank()),
      size_(transport_->size()),
      send_seq_(size_, 0),
      recv_seq_(size_, 0),
      algo_names_(static_cast<size_t>(Collective::kCount)),
      fork_generation_(fork_generation()) {
  for (int c = 0; c < static_cast<int>(Collective::kCount); ++c) {
    Collective cc = static_cast<Collective>(c);
    if (cc != Collective::Send && cc != Collective::Recv) {
      algo_names_[c] = algorithms(cc);
      env_algo_.push_back(algorithm_override(cc));
    } else {
      env_algo_.emplace_back();
    }
  }
  tuning_generation_ = tuning_generation();
  for (int p = 0; p < size_; ++p) link_kinds_.push_back(transport_->link_kind(p));
}

std::vector<std::string> Communicator::link_kinds() const {
  std::vector<std::string> out;
  for (LinkKind k : link_kinds_) out.push_back(link_kind_name(k));
  return out;
}

Communicator::~Communicator() {
  try {
    close();
  } catch (...) {
  }
}

void Communicator::throw_if_aborted() const {
  if (aborted_.load(std::memory_order_acquire))
    throw_kind(abort_kind_, "communicator aborted: " + abort_message_);
}

void Communicator::record_failure(const CommError& e, ErrorKind kind) {
  std::lock_guard<std::mutex> lk(mu_);
  if (!aborted_.load(std::memory_order_relaxed)) {
    abort_kind_ = kind;
    abort_message_ = e.what();
    aborted_.store(true, std::memory_order_release);
  }
}

void Communicator::fail_communicator(const CommError& e) {
  // The executor already told the peers about mismatches and peer failures it detected; other
  // errors (e.g. a schedule referencing a missing buffer) are published here.
  ErrorKind kind = dynamic_cast<const MismatchError*>(&e) ? ErrorKind::Mismatch
                   : dynamic_cast<const PeerError*>(&e)   ? ErrorKind::Peer
                                                          : ErrorKind::Comm;
  if (kind == ErrorKind::Comm) transport_->publish_failure(kind, e.what());
  record_failure(e, kind);
}

void Communicator::abort(const std::string& reason) {
  if (fork_generation_ != fork_generation()) throw CommError(forked_message(rank_, opts_.label));
  std::unique_lock<std::mutex> lk(mu_);
  if (closed_) return;
  lk.unlock();
  transport_->publish_failure(ErrorKind::Comm, "rank " + std::to_string(rank_) + " aborted: " + reason);
  record_failure(CommError(reason), ErrorKind::Comm);
}

template <typename Job>
std::shared_ptr<Work> Communicator::submit(Job&& job, bool async) {
  // Checked before taking the lock: in a forked child another thread of the parent may hold it.
  if (fork_generation_ != fork_generation()) throw CommError(forked_message(rank_, opts_.label));
  std::unique_lock<std::mutex> lk(mu_);
  if (closed_) throw CommError("communicator is closed");
  throw_if_aborted();
  const std::thread::id me = std::this_thread::get_id();
  if (!async) {
    // Two threads' blocking calls would be ordered differently on different ranks and pair up
    // wrongly; refuse, and abort so every rank learns why.
    if (blocking_thread_ != std::thread::id() && blocking_thread_ != me) {
      lk.unlock();
      const std::string msg = concurrent_threads_message(rank_, opts_.label);
      abort(msg);
      throw CommError(msg);
    }
    blocking_thread_ = me;
  }
  struct BlockingDone {  // clears blocking_thread_ however the blocking call ends
    Communicator* c;
    bool active;
    ~BlockingDone() {
      if (!active) return;
      std::lock_guard<std::mutex> g(c->mu_);
      c->blocking_thread_ = std::thread::id();
    }
  };
  if (!async && queue_.empty() && !busy_) {
    busy_ = true;
    lk.unlock();
    struct Done {
      Communicator* c;
      ~Done() {
        std::lock_guard<std::mutex> g(c->mu_);
        c->busy_ = false;
        c->blocking_thread_ = std::thread::id();
        c->cv_.notify_all();
      }
    } done{this};
    job();
    return nullptr;
  }
  auto work = std::make_shared<Work>(std::function<void()>(std::forward<Job>(job)));
  if (!worker_.joinable()) worker_ = std::thread([this] { worker_loop(); });
  queue_.push_back(work);
  cv_.notify_all();
  lk.unlock();
  if (async) return work;
  BlockingDone blocking_done{this, true};
  work->wait(-1);
  return nullptr;
}

void Communicator::worker_loop() {
  std::unique_lock<std::mutex> lk(mu_);
  for (;;) {
    cv_.wait(lk, [&] { return (stop_ && queue_.empty()) || (!queue_.empty() && !busy_); });
    if (queue_.empty()) break;
    auto work = queue_.front();
    queue_.pop_front();
    busy_ = true;
    lk.unlock();
    work->run();
    lk.lock();
    busy_ = false;
    cv_.notify_all();
  }
}

void Communicator::forget_in_forked_child() {
  // The worker thread and the parent's other threads do not exist here, and the region's control
  // block is the parent's: telling peers "closed" would close the parent's rank. Drop everything
  // without touching shared state (leaking the handles is the point).
  if (closed_) return;
  closed_ = true;
  if (worker_.joinable()) new std::thread(std::move(worker_));
  (void)transport_.release();
}

void Communicator::close() {
  if (fork_generation_ != fork_generation()) return forget_in_forked_child();
  std::unique_lock<std::mutex> lk(mu_);
  if (closed_) return;
  cv_.wait(lk, [&] { return queue_.empty() && !busy_; });
  closed_ = true;
  stop_ = true;
  cv_.notify_all();
  lk.unlock();
  if (worker_.joinable()) worker_.join();
  // Unmap now rather than at garbage collection: peers keep their own mappings of the region.
  transport_->close();
  transport_.reset();
}

std::shared_ptr<Work> Communicator::collective(const CollectiveCall& call, bool async) {
  const std::string overlap = overlap_problem(call, rank_, size_);
  if (!overlap.empty()) throw std::invalid_argument(overlap);
  return submit([this, call] { run_collective(call); }, async);
}

std::shared_ptr<Work> Communicator::p2p(std::vector<P2PItem> items, DType dtype, bool async) {
  for (const P2PItem& it : items) {
    if (it.peer < 0 || it.peer >= size_ || it.peer == rank_)
      throw std::invalid_argument("peer: " + std::to_string(it.peer) + " is not another rank of this communicator (size " +
                                  std::to_string(size_) + ")");
    if (it.count < 0) throw std::invalid_argument("count: negative");
  }
  return submit([this, items = std::move(items), dtype] { run_p2p(items, dtype); }, async);
}

const Communicator::Planned& Communicator::plan(const CollectiveCall& call, int64_t bytes) {
  const uint64_t gen = tuning_generation();
  if (gen != tuning_generation_) {  // a new tuning table: auto may choose differently now
    plans_.clear();
    tuning_generation_ = gen;
  }
  const int root = collective_has_root(call.coll) ? call.root : 0;
  ScheduleKey key{static_cast<uint8_t>(call.coll), call.algo, root, call.count};
  auto it = plans_.find(key);
  if (it != plans_.end()) return it->second;

  const auto& names = algo_names_[static_cast<int>(call.coll)];
  if (call.algo > names.size())
    throw std::invalid_argument("algorithm: index " + std::to_string(call.algo) + " out of range for " +
                                collective_name(call.coll));
  const std::string algo = call.algo ? names[call.algo - 1]
                                     : choose_auto(call.coll, env_algo_[static_cast<int>(call.coll)], bytes, size_);
  if (opts_.debug >= 1 && call.algo == 0) {
    std::string tag = std::string(collective_name(call.coll)) + ":" + algo;
    bool seen = false;
    for (const auto& s : logged_auto_) seen |= s == tag;
    if (!seen) {
      logged_auto_.push_back(tag);
      std::fprintf(stderr, "commlib INFO %s rank %d: auto picked %s for %s of %lld bytes on %d ranks\n",
                   opts_.label.c_str(), rank_, algo.c_str(), collective_name(call.coll),
                   static_cast<long long>(bytes), size_);
    }
  }
  Planned p;
  p.sched = build_schedule(CollArgs{call.coll, rank_, size_, call.count, call.root, topology_.host_of}, algo);
  p.algo = static_cast<uint8_t>(algorithm_index(call.coll, algo));
  if (plans_.size() >= 512) plans_.clear();
  return plans_.emplace(key, std::move(p)).first->second;
}

char* Communicator::scratch(size_t bytes) {
  if (bytes > scratch_bytes_) {
    scratch_.reset(aligned_alloc_bytes(bytes));
    scratch_bytes_ = bytes;
  }
  return scratch_.get();
}

char* Communicator::input_copy(size_t bytes) {
  if (bytes > input_copy_bytes_) {
    input_copy_.reset(aligned_alloc_bytes(bytes));
    input_copy_bytes_ = bytes;
  }
  return input_copy_.get();
}

void Communicator::run_collective(const CollectiveCall& call) {
  throw_if_aborted();
  const size_t esize = dtype_size(call.dtype);
  const int64_t bytes = call.count * static_cast<int64_t>(esize);
  // Built before the call is numbered: a refused argument leaves the sequence untouched.
  const Planned& planned = plan(call, bytes);
  const Schedule& sched = planned.sched;
  const std::string& algo = algo_names_[static_cast<int>(call.coll)][planned.algo - 1];

  CallDesc desc;
  desc.coll = static_cast<uint8_t>(call.coll);
  desc.dtype = static_cast<uint8_t>(call.dtype);
  desc.op = collective_reduces(call.coll) ? static_cast<uint8_t>(call.op) : 0;
  desc.algo = planned.algo;
  desc.root = collective_has_root(call.coll) ? call.root : 0;
  desc.count = call.count;
  desc.seq = ++coll_seq_;
  transport_->publish_call(desc);

  const auto t0 = opts_.debug >= 2 ? Clock::now() : Clock::time_point{};
  try {
    exec_.check_peers_failed(desc);
    const size_t copy_chunk = (!collective_reduces(call.coll) && size_ >= 4) ? exec_.options().copy_chunk_bytes : 0;
    exec_.begin_call(static_cast<size_t>(output_elements(call.coll, call.count, size_)) * esize * size_, copy_chunk);

    char* in = reinterpret_cast<char*>(call.input);
    char* out = reinterpret_cast<char*>(call.output);
    const bool owns_input = !((call.coll == Collective::Broadcast || call.coll == Collective::Scatter) &&
                              rank_ != call.root);
    if (call.op == RedOp::PremulSum && collective_reduces(call.coll) && owns_input) {
      // Scale into a private copy: the schedule then runs in its out-of-place form.
      size_t n = static_cast<size_t>(input_elements(call.coll, call.count, size_));
      char* buf = input_copy(n * esize);
      scale_copy(buf, in, n, call.dtype, call.scale);
      in = buf;
    } else if (call.coll == Collective::AllToAll && in == out && call.count) {
      // In place: every block is both sent and overwritten, so send from a copy. The schedules
      // take distinct buffers (the verifier proves them for that layout).
      const size_t n = static_cast<size_t>(call.count) * size_ * esize;
      char* buf = input_copy(n);
      std::memcpy(buf, in, n);
      in = buf;
    }
    char* scr = sched.scratch_count ? scratch(static_cast<size_t>(sched.scratch_count) * esize) : nullptr;
    char* bases[3] = {in, out, scr};

    for (const Step& step : sched.steps) {
      ops_.clear();
      for (const Op& op : step.ops) {
        ExecOp e;
        e.kind = op.kind;
        e.peer = op.peer;
        e.desc = desc;
        const Region& r = (op.kind == OpKind::Send) ? op.src : op.dst;
        e.bytes = static_cast<size_t>(r.count) * esize;
        auto resolve = [&](const Region& reg) -> char* {
          char* base = bases[static_cast<int>(reg.buf)];
          if (!base) {
            if (reg.count == 0) return nullptr;
            throw CommError(std::string("internal error: ") + algo + " schedule of " + describe_call(desc) + " on rank " +
                            std::to_string(rank_) + " uses the " + buffer_name(reg.buf) +
                            " buffer, which this rank does not have");
          }
          return base + static_cast<size_t>(reg.offset) * esize;
        };
        if (op.kind == OpKind::Send) {
          e.src = resolve(op.src);
        } else {
          e.dst = resolve(op.dst);
          if (op.kind == OpKind::Copy || op.kind == OpKind::Reduce || reduces_from_src(op)) e.src = resolve(op.src);
        }
        ops_.push_back(e);
      }
      exec_.run_step(ops_, call.dtype, call.op, desc);
    }

    if (call.op == RedOp::Avg && collective_reduces(call.coll) && (call.coll != Collective::Reduce || rank_ == call.root))
      divide_inplace(out, static_cast<size_t>(call.count), call.dtype, size_);
  } catch (const CommError& e) {
    fail_communicator(e);
    throw;
  }
  if (opts_.debug >= 2) {
    double us = std::chrono::duration<double, std::micro>(Clock::now() - t0).count();
    std::fprintf(stderr, "commlib TRACE %s rank %d: %s done in %.1f us\n", opts_.label.c_str(), rank_,
                 describe_call(desc).c_str(), us);
  }
}

void Communicator::run_p2p(const std::vector<P2PItem>& items, DType dtype) {
  throw_if_aborted();
  const size_t esize = dtype_size(dtype);
  ops_.clear();
  CallDesc any;
  for (size_t i = 0; i < items.size(); ++i) {
    const P2PItem& it = items[i];
    ExecOp e;
    e.kind = it.send ? OpKind::Send : OpKind::Recv;
    e.peer = it.peer;
    e.bytes = static_cast<size_t>(it.count) * esize;
    e.desc.coll = static_cast<uint8_t>(Collective::Send);
    e.desc.dtype = static_cast<uint8_t>(dtype);
    e.desc.count = it.count;
    e.desc.seq = it.send ? ++send_seq_[it.peer] : ++recv_seq_[it.peer];
    if (it.send)
      e.src = reinterpret_cast<const char*>(it.ptr);
    else
      e.dst = reinterpret_cast<char*>(it.ptr);
    ops_.push_back(e);
    any = e.desc;
  }
  const auto t0 = opts_.debug >= 2 ? Clock::now() : Clock::time_point{};
  try {
    exec_.check_peers_failed(any);
    size_t largest = 0;
    for (const ExecOp& e : ops_) largest = std::max(largest, e.bytes);
    exec_.begin_call(largest);
    exec_.run_step(ops_, dtype, RedOp::Sum, any);
  } catch (const CommError& e) {
    fail_communicator(e);
    throw;
  }
  if (opts_.debug >= 2) {
    double us = std::chrono::duration<double, std::micro>(Clock::now() - t0).count();
    std::fprintf(stderr, "commlib TRACE %s rank %d: batch of %zu sends/recvs done in %.1f us\n",
                 opts_.label.c_str(), rank_, items.size(), us);
  }
}

}  // namespace commlib
