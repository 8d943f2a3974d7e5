// The symbolic verifier's entry points (verifier.h): argument checks, schedules built from the
// registry, and one Replay (verifier_replay.h) per in-place and out-of-place layout.
#include "verify/verifier.h"

#include <stdexcept>

#include "policy/auto_policy.h"
#include "schedule/lanes.h"
#include "verify/verifier_lanes.h"
#include "verify/verifier_replay.h"
#include "schedule/registry.h"

namespace commlib {

namespace {

// Bounded by run time and memory (a ring at P ranks plays ~2P^2 transfers), not by representation.
void check_size(int size) {
  if (size < 1 || size > kMaxVerifiedRanks)
    throw std::invalid_argument("size: the verifier supports 1.." + std::to_string(kMaxVerifiedRanks) +
                                " ranks, got " + std::to_string(size));
}

}  // namespace

bool collective_has_in_place(Collective c) {
  return c != Collective::AllToAll && c != Collective::Barrier && c != Collective::Send &&
         c != Collective::Recv;
}

void verify_schedules(Collective c, const std::vector<Schedule>& per_rank, int size, int64_t count, int root,
                      bool in_place, const std::string& label) {
  check_size(size);
  if (count < 0) throw std::invalid_argument("count: must be >= 0, got " + std::to_string(count));
  if (collective_has_root(c) && (root < 0 || root >= size))
    throw std::invalid_argument("root: " + std::to_string(root) + " out of range [0, " + std::to_string(size) + ")");
  if (c == Collective::Send || c == Collective::Recv || c == Collective::kCount)
    throw std::invalid_argument(std::string("collective: ") + collective_name(c) + " has no schedules");
  if (!collective_has_root(c)) root = 0;
  verify::Replay(c, per_rank, size, count, root, in_place, label).run();
}

std::string verify_algorithm(Collective c, const std::string& algorithm, int size, int64_t count, int root,
                             DType dtype) {
  check_size(size);
  std::vector<Schedule> per_rank(size);
  CollArgs a;
  a.coll = c;
  a.size = size;
  a.count = count;
  a.root = collective_has_root(c) ? root : 0;
  // One host (the verifier has no host map): the size policy.
  const std::string name =
      resolve_algorithm(CallShape{c, count, static_cast<int>(dtype_size(dtype)), a.root}, algorithm,
                        algorithm_override(c), size, {}, nullptr)
          .algorithm;
  for (int r = 0; r < size; ++r) {
    a.rank = r;
    per_rank[r] = build_schedule(a, name);
  }
  check_lanes(c, per_rank, size, count, a.root, schedule_lanes(a, name), name);
  verify_schedules(c, per_rank, size, count, a.root, false, name);
  if (collective_has_in_place(c)) verify_schedules(c, per_rank, size, count, a.root, true, name);
  return name;
}

}  // namespace commlib
