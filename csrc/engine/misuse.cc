#include "engine/misuse.h"

#include <pthread.h>
#include <unistd.h>

#include <atomic>

namespace commlib {

namespace {

std::atomic<uint64_t> g_fork_generation{0};

void on_fork_child() { g_fork_generation.fetch_add(1, std::memory_order_relaxed); }

// Registered when the library loads, before any communicator exists.
const int g_registered = pthread_atfork(nullptr, nullptr, on_fork_child);

struct Layout {
  const char* in_name;
  const char* out_name;
  int64_t in_elems, out_elems;
  // The one overlapping layout that is allowed: output at `in_place_offset` elements into input
  // (negative: input that far into output), with these sizes.
  int64_t in_place_offset;
};

Layout layout(const CollectiveCall& c, int rank, int size) {
  const int64_t n = c.count, block = static_cast<int64_t>(rank) * n;
  switch (c.coll) {
    case Collective::AllReduce:
    case Collective::Reduce:
      return {"tensor", "out", n, n, 0};
    case Collective::AllGather:
    case Collective::Gather:  // input may be this rank's block of output
      return {"input", "output", n, n * size, -block};
    case Collective::ReduceScatter:
    case Collective::Scatter:  // output may be this rank's block of input
      return {"input", "output", n * size, n, block};
    case Collective::AllToAll:
      return {"input", "output", n * size, n * size, 0};
    default:
      return {"input", "output", 0, 0, 0};
  }
}

}  // namespace

uint64_t fork_generation() {
  (void)g_registered;
  return g_fork_generation.load(std::memory_order_relaxed);
}

std::string overlap_problem(const CollectiveCall& call, int rank, int size) {
  if (call.input == 0 || call.output == 0) return "";  // non-root ranks of rooted collectives
  const Layout l = layout(call, rank, size);
  const uint64_t es = dtype_size(call.dtype);
  const uint64_t in_lo = call.input, in_hi = in_lo + static_cast<uint64_t>(l.in_elems) * es;
  const uint64_t out_lo = call.output, out_hi = out_lo + static_cast<uint64_t>(l.out_elems) * es;
  if (in_lo >= out_hi || out_lo >= in_hi || l.in_elems == 0 || l.out_elems == 0) return "";  // disjoint
  const int64_t offset_bytes = l.in_place_offset * static_cast<int64_t>(es);
  if (out_lo == in_lo + static_cast<uint64_t>(offset_bytes)) return "";  // the supported in-place form
  std::string allowed = l.in_place_offset == 0
                            ? std::string("the very same buffer")
                        : l.in_place_offset < 0 ? std::string(l.in_name) + " as this rank's block of " + l.out_name
                                                : std::string(l.out_name) + " as this rank's block of " + l.in_name;
  return std::string(l.out_name) + ": partly overlaps " + l.in_name + "; " + collective_name(call.coll) + " works in place only with " + allowed +
         ", or with separate buffers";
}

std::string forked_message(int rank, const std::string& label) {
  return "communicator " + label + " (rank " + std::to_string(rank) +
         ") was created in another process and is used in a forked child (pid " + std::to_string(getpid()) +
         "); a child must create its own communicator";
}

std::string concurrent_threads_message(int rank, const std::string& label) {
  return "two threads made blocking calls on communicator " + label + " (rank " + std::to_string(rank) +
         ") at the same time; calls must reach every rank in the same order, so one thread at a time "
         "may call (or issue async_op=True calls in a fixed order)";
}

}  // namespace commlib
