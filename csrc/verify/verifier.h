// The symbolic verifier (docs/DESIGN.md, "Engines"): runs every rank's schedule on symbolic values instead of
// bytes and checks the result. Each element is (source index, contributor set); rank r's input
// element i starts as (i, {r}); a reduction needs equal source indices and disjoint sets.
// Communication is rendezvous: a send completes only when the peer's current step holds the
// matching receive from this rank (FIFO per ordered pair); a step completes when all its
// communication ops matched, then its local ops run. Also checked, per step: op independence
// (including in-place aliasing), region bounds, buffers the rank does not own, inputs never
// written, equal counts on matched send/recv (a pair's messages in one step match in op order, ir.h).
#pragma once

#include <array>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

#include "schedule/ir.h"

namespace commlib {

struct VerificationError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// Largest world size verify_* accept.
constexpr int kMaxVerifiedRanks = 16384;

// True when the collective has an in-place (aliased) layout (ir.h); all but all_to_all, barrier.
bool collective_has_in_place(Collective c);

// Builds the registered `algorithm` for every rank and verifies it in the non-aliased layout and,
// where the collective has one, the in-place layout. "auto" resolves as for `count` elements of
// `dtype` (choose_algorithm takes bytes). Returns the name verified. Throws VerificationError (or
// std::invalid_argument for bad arguments).
std::string verify_algorithm(Collective c, const std::string& algorithm, int size, int64_t count, int root = 0,
                             DType dtype = DType::Float32);

// Verifies given per-rank schedules (per_rank.size() == size) in one layout. `label` names the
// algorithm in messages.
void verify_schedules(Collective c, const std::vector<Schedule>& per_rank, int size, int64_t count,
                      int root, bool in_place, const std::string& label);

// What the verifier knows after every step, for the schedule explorer (commlib explain): a run of
// elements [start, start + len) of a buffer holds source elements src, src + 1, ... reduced from
// the inputs of `ranks` (src < 0: not a valid value, as verifier_values.h's kUninit and others).
struct HeldRun {
  int64_t start, len, src;
  std::vector<int> ranks;
};
struct HeldBuffer {
  int64_t size = -1;  // elements; -1: the rank does not own this buffer
  std::vector<HeldRun> runs;
};
// holdings[rank][k][buffer id]: the rank's buffers before its first step (k = 0) and after its
// step k - 1, in the out-of-place layout (verifier_trace.cc).
using Holdings = std::vector<std::vector<std::array<HeldBuffer, 3>>>;

// Verifies per-rank schedules as verify_schedules does (out-of-place layout) and returns what every
// rank holds after each of its steps. Meant for small worlds: the result grows as ranks^2 x steps.
Holdings trace_schedules(Collective c, const std::vector<Schedule>& per_rank, int size, int64_t count, int root,
                         const std::string& label);

}  // namespace commlib
