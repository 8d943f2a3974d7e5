#include "host/misuse.h"

#include <pthread.h>
#include <unistd.h>

#include <atomic>
#include <utility>

#include "common/shapes.h"

namespace commlib {

namespace {

std::atomic<uint64_t> g_fork_generation{0};

void on_fork_child() { g_fork_generation.fetch_add(1, std::memory_order_relaxed); }

// Registered when the library loads, before any communicator exists.
const int g_registered = pthread_atfork(nullptr, nullptr, on_fork_child);

// The argument names the Python API uses for a collective's two buffers (for the message).
std::pair<const char*, const char*> buffer_names(Collective c) {
  if (c == Collective::AllReduce || c == Collective::Reduce) return {"tensor", "out"};
  return {"input", "output"};
}

}  // namespace

uint64_t fork_generation() {
  (void)g_registered;
  return g_fork_generation.load(std::memory_order_relaxed);
}

std::string overlap_problem(const CollectiveCall& call, int rank, int size) {
  if (call.input == 0 || call.output == 0) return "";  // non-root ranks of rooted collectives
  if (call.input == call.output && in_place_is_the_same_buffer(call.coll)) return "";  // in place: allowed
  // Sizes and the one allowed in-place placement come from the shapes table (common/shapes.h).
  // Rooted collectives are judged by the root's shapes on every rank, so a layout is refused on
  // all ranks or on none (a rank refusing alone would leave its peers waiting in the call).
  const int as_rank = collective_has_root(call.coll) ? call.root : rank;
  const BufferShapes sh = buffer_shapes(call.coll, call.count, size, as_rank, call.root);
  if (sh.input <= 0 || sh.output <= 0) return "";
  const uint64_t es = dtype_size(call.dtype);
  const uint64_t in_lo = call.input, in_hi = in_lo + static_cast<uint64_t>(sh.input) * es;
  const uint64_t out_lo = call.output, out_hi = out_lo + static_cast<uint64_t>(sh.output) * es;
  if (in_lo >= out_hi || out_lo >= in_hi) return "";  // disjoint
  // In place: the input is the output's block at input_at, or the output the input's at output_at.
  const bool input_inside = sh.input_at >= 0;
  const int64_t at = input_inside ? sh.input_at : sh.output_at;
  if (at >= 0 && (input_inside ? in_lo == out_lo + static_cast<uint64_t>(at) * es
                               : out_lo == in_lo + static_cast<uint64_t>(at) * es))
    return "";  // the supported in-place form
  const auto [in_name, out_name] = buffer_names(call.coll);
  const std::string allowed = at < 0    ? std::string("no overlap at all")
                              : at == 0 && sh.input == sh.output ? std::string("the very same buffer")
                              : input_inside ? std::string(in_name) + " as this rank's block of " + out_name
                                             : std::string(out_name) + " as this rank's block of " + in_name;
  return std::string(out_name) + ": partly overlaps " + in_name + "; " + collective_name(call.coll) +
         " works in place only with " + allowed + ", or with separate buffers";
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
