// The communicator's life cycle and its work queue: calls run one at a time in call order, inline
// when a blocking call finds the queue empty, else on a worker thread; failures abort it.
#include "host/communicator.h"

#include <chrono>

#include "host/misuse.h"
#include "policy/auto_policy.h"

namespace commlib {

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
      plans_(make_plan_context(rank_, size_, topology_)),
      fork_generation_(fork_generation()) {
  for (int p = 0; p < size_; ++p) link_kinds_.push_back(transport_->transport_name(p));
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
  {
    std::lock_guard<std::mutex> lk(mu_);
    if (aborted_.load(std::memory_order_relaxed)) return;
    abort_kind_ = kind;
    abort_message_ = e.what();
    aborted_.store(true, std::memory_order_release);
  }
  // Outside mu_: a listener (a stream engine failing) calls back into fail_from_engine, which
  // then finds the communicator aborted and returns.
  const std::string message = e.what();
  abort_listeners_.for_each([&](auto& fn) { fn(kind, message); });
}

void Communicator::fail_from_engine(ErrorKind kind, const std::string& message) {
  record_failure(CommError(message), kind);
}

int Communicator::add_abort_listener(std::function<void(ErrorKind, const std::string&)> fn) {
  return abort_listeners_.add(std::move(fn), [this](auto& added) {
    if (!aborted_.load(std::memory_order_acquire)) return;
    ErrorKind kind;
    std::string message;
    {
      std::lock_guard<std::mutex> g(mu_);
      kind = abort_kind_;
      message = abort_message_;
    }
    added(kind, message);
  });
}

void Communicator::remove_abort_listener(int id) { abort_listeners_.remove(id); }

int Communicator::add_close_listener(std::function<void()> fn) { return close_listeners_.add(std::move(fn)); }

void Communicator::remove_close_listener(int id) { close_listeners_.remove(id); }

void Communicator::publish_call(const CallDesc& desc) {
  std::lock_guard<std::mutex> lk(publish_mu_);
  if (desc.seq < published_seq_) return;
  published_seq_ = desc.seq;
  transport_->publish_call(desc);
}

void Communicator::fail_communicator(const CommError& e) {
  // The executor already told the peers about mismatches and peer failures it detected; other
  // errors (e.g. a schedule referencing a missing buffer) are published here.
  const ErrorKind kind = kind_of(e);
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

std::shared_ptr<Work> Communicator::submit_function(std::function<void()> job, bool async) {
  return submit(std::move(job), async);
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
  // The stream engines, while the transport their watchdogs read is up; an engine destroyed on
  // another thread meanwhile waits in its remove_close_listener (the list's lock is held).
  close_listeners_.take_all_and_call();
  // Unmap now rather than at garbage collection: peers keep their own mappings of the region.
  transport_->close();
  transport_.reset();
}

std::shared_ptr<Work> Communicator::collective(const CollectiveCall& call, bool async, double timeout_s) {
  const std::string overlap = overlap_problem(call, rank_, size_);
  if (!overlap.empty()) throw std::invalid_argument(overlap);
  // Numbered when submitted, not when run: a device call made in between takes the next number
  // on every rank alike.
  const uint64_t seq = next_call_seq();
  if (timeout_s > 0)
    return submit(
        [this, call, seq, timeout_s] {
          CallTimeout call_timeout(exec_, timeout_s);
          run_collective(call, seq);
        },
        async);
  return submit([this, call, seq] { run_collective(call, seq); }, async);
}

namespace {

void check_p2p_items(const std::vector<P2PItem>& items, int rank, int size) {
  for (const P2PItem& it : items) {
    if (it.peer < 0 || it.peer >= size || it.peer == rank)
      throw std::invalid_argument("peer: " + std::to_string(it.peer) + " is not another rank of this communicator (size " +
                                  std::to_string(size) + ")");
    if (it.count < 0) throw std::invalid_argument("count: negative");
  }
}

}  // namespace

std::vector<uint64_t> Communicator::p2p_seqs(const std::vector<P2PItem>& items) {
  // Numbered when submitted (device messages made in between take the next numbers), unless a
  // receive from any source is queued ahead: its sender is known only when it runs.
  std::vector<uint64_t> seqs;
  std::lock_guard<std::mutex> lk(p2p_mu_);
  if (!queued_any_)
    for (const P2PItem& it : items) seqs.push_back(it.send ? ++send_seq_[it.peer] : ++recv_seq_[it.peer]);
  return seqs;
}

std::shared_ptr<Work> Communicator::p2p(std::vector<P2PItem> items, DType dtype, bool async, double timeout_s) {
  check_p2p_items(items, rank_, size_);
  std::vector<uint64_t> seqs = p2p_seqs(items);
  return submit(
      [this, items = std::move(items), dtype, seqs, timeout_s] {
        CallTimeout call_timeout(exec_, timeout_s);
        run_p2p(items, dtype, seqs);
      },
      async);
}

std::shared_ptr<Work> Communicator::all_to_allv(std::vector<P2PItem> items, DType dtype, int64_t count, bool async,
                                                double timeout_s) {
  check_p2p_items(items, rank_, size_);
  // The collective's number first, as collective() takes it when submitted (a device call made in
  // between takes the next one on every rank alike), then the messages' numbers per pair.
  CallDesc desc;
  desc.coll = static_cast<uint8_t>(Collective::AllToAll);
  desc.dtype = static_cast<uint8_t>(dtype);
  desc.count = count;
  desc.seq = next_call_seq();
  std::vector<uint64_t> seqs = p2p_seqs(items);
  return submit(
      [this, items = std::move(items), dtype, seqs, desc, timeout_s] {
        CallTimeout call_timeout(exec_, timeout_s);
        run_p2p(items, dtype, seqs, &desc);
      },
      async);
}

uint64_t Communicator::next_p2p_seq(int peer, bool send) {
  std::lock_guard<std::mutex> lk(p2p_mu_);
  return send ? ++send_seq_[peer] : ++recv_seq_[peer];
}

uint64_t Communicator::peek_p2p_seq(int peer, bool send) {
  std::lock_guard<std::mutex> lk(p2p_mu_);
  return (send ? send_seq_[peer] : recv_seq_[peer]) + 1;
}

bool Communicator::peek_host_message(int peer, CallDesc* desc) {
  std::lock_guard<std::mutex> lk(mu_);  // no host call starts meanwhile
  if (busy_ || !queue_.empty() || closed_ || !transport_) return false;
  const char* payload = nullptr;
  const ChunkHeader* h = transport_->link(peer).peek_recv(&payload);
  if (!h) return false;
  *desc = h->desc;
  return true;
}

int Communicator::add_p2p_probe(std::function<bool(int, const CallDesc&, CallDesc*)> fn) {
  return exec_.add_p2p_probe(std::move(fn));
}

void Communicator::remove_p2p_probe(int id) { exec_.remove_p2p_probe(id); }

}  // namespace commlib
