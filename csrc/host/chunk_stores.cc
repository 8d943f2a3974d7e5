// How a send's chunk is copied into its channel slot: plain stores or non-temporal ones, chosen
// per peer by measuring (host/ring_stores.h, as the shared broadcast's root does for its stream).
// A receiver on another core keeps the slot's lines it read in its caches, so plain stores must take
// each back before writing it again: with 4 ranks on 2 cores spread 2+2 (`bench/small_call_ranks.py
// broadcast --algorithm binomial --pin`), a binomial broadcast of 512 KiB and 2 MiB cost 572-587 and
// 2349-2403 µs of CPU a call (all ranks) against 120-122 and 551-592 all on one core; measured
// stores 140-145 and 506-510, and 122-123 and 556-581 on one core (bench/RESULTS_collectives.md,
// session 22). Messages below four 16 KiB pieces are not measured and stay plain; chunks below
// 16 KiB (a message's last) are written as chosen but not measured.
#include <chrono>
#include <cstring>

#include "host/executor.h"
#include "kernels/cpu_copy.h"

namespace commlib {

namespace {
constexpr size_t kMeasuredChunk = size_t{16} << 10;  // smaller chunks' times are mostly overhead
}  // namespace

void Executor::fill_chunk(const ExecOp& o, char* payload, size_t n) {
  const char* src = o.src + o.done;
  if (o.bytes < 4 * kMeasuredChunk) {
    if (n) std::memcpy(payload, src, n);
    return;
  }
  if (chunk_stores_.size() <= static_cast<size_t>(o.peer)) chunk_stores_.resize(o.peer + 1);
  RingStores& s = chunk_stores_[o.peer];
  if (o.done == 0) s.begin_call();  // a message is one "call" of the measure
  const bool nt = s.next_piece();
  const auto t0 = std::chrono::steady_clock::now();
  if (nt)
    copy_bytes(payload, src, n, true);
  else
    std::memcpy(payload, src, n);
  if (n >= kMeasuredChunk)
    s.piece(n, std::chrono::duration<double, std::nano>(std::chrono::steady_clock::now() - t0).count());
  if (o.done + n == o.bytes) s.end_call();
}

}  // namespace commlib
