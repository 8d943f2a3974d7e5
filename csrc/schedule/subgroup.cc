// The sub-group combinator (subgroup.h).
#include "schedule/subgroup.h"

#include <algorithm>
#include <stdexcept>

#include "schedule/registry.h"

namespace commlib {
namespace sched {

namespace {

Region rebase(const Region& r, const Subgroup& g) {
  const Rebase& b = r.buf == BufferId::Input ? g.input : r.buf == BufferId::Output ? g.output : g.scratch;
  return Region{b.buf, b.offset + r.offset, r.count};
}

}  // namespace

Schedule on_subgroup(Collective coll, const std::string& algorithm, int rank, int64_t count, int root,
                     const Subgroup& g, const char* what) {
  if (algorithm == "hierarchical")
    throw std::invalid_argument(std::string(what) + ": 'hierarchical' cannot run a phase of itself");
  const auto at = std::find(g.members.begin(), g.members.end(), rank);
  if (at == g.members.end())
    throw std::logic_error("on_subgroup: rank " + std::to_string(rank) + " is not in the sub-group");
  CollArgs sub;
  sub.coll = coll;
  sub.rank = static_cast<int>(at - g.members.begin());
  sub.size = static_cast<int>(g.members.size());
  sub.count = count;
  sub.root = root;
  if (!algorithm_registered(coll, algorithm))
    throw std::invalid_argument(std::string(what) + ": unknown " + std::string(collective_name(coll)) + " algorithm '" +
                                algorithm + "' (expected one of: " + expected_algorithms(coll) + ")");
  // Its regions are rebased into the parent's buffers, which the peers have not mapped (and the
  // phases around it send messages: a schedule uses one-sided ops or messages, not both).
  if (algorithm_is_one_sided(coll, algorithm))
    throw std::invalid_argument(std::string(what) + ": " + collective_name(coll) + " algorithm '" + algorithm +
                                "' is one-sided and cannot run a phase of a hierarchical schedule");
  Schedule s = build_schedule(sub, algorithm);
  for (Step& st : s.steps) {
    for (Op& o : st.ops) {
      if (o.peer >= 0) o.peer = g.members[o.peer];
      const bool has_dst = o.kind != OpKind::Send, has_src = o.kind == OpKind::Send || o.kind == OpKind::Copy ||
                                                               o.kind == OpKind::Reduce || reduces_from_src(o);
      if (has_dst) o.dst = rebase(o.dst, g);
      if (has_src) o.src = rebase(o.src, g);
    }
  }
  const int64_t sub_scratch = s.scratch_count;
  s.scratch_count = 0;
  if (sub_scratch > 0) {
    if (g.scratch.buf != BufferId::Scratch)
      throw std::logic_error("on_subgroup: the sub-schedule needs scratch; map it onto the scratch buffer");
    s.scratch_count = g.scratch.offset + sub_scratch;
  }
  return s;
}

void append_schedule(Schedule& s, const Schedule& more) {
  s.steps.insert(s.steps.end(), more.steps.begin(), more.steps.end());
  s.scratch_count = std::max(s.scratch_count, more.scratch_count);
}

std::vector<Step> zip_steps(const std::vector<std::vector<Step>>& lists) {
  size_t len = 0;
  for (const auto& l : lists) len = std::max(len, l.size());
  std::vector<Step> out;
  for (size_t k = 0; k < len; ++k) {
    Step st;
    for (const auto& l : lists)
      if (k < l.size()) st.ops.insert(st.ops.end(), l[k].ops.begin(), l[k].ops.end());
    if (!st.ops.empty()) out.push_back(std::move(st));
  }
  return out;
}

}  // namespace sched
}  // namespace commlib
