// The sub-group combinator (subgroup.h).
#include "schedule/subgroup.h"

#include <algorithm>
#include <map>
#include <stdexcept>
#include <utility>

#include "schedule/lanes.h"
#include "schedule/radix_exchange.h"
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
  if (algorithm == "hierarchical" || algorithm == "rail_split")  // rail_split runs hierarchical on its rest
    throw std::invalid_argument(std::string(what) + ": '" + algorithm + "' cannot run a phase of hierarchical");
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
  // A phase runs as one lane of its parent (whose lanes are its own): a laned algorithm's lanes
  // become each step's concurrent ops (merge_rounds; the laned ones that may run here, rail_ring's
  // channels, are in lock step).
  if (schedule_lanes(sub, algorithm) > 1) {
    s.steps = merge_rounds(s.steps);
    s.window = 0;
  }
  return rebased_on(std::move(s), g);
}

Schedule rebased_on(Schedule s, const Subgroup& g) {
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

std::vector<Step> merge_rounds(const std::vector<Step>& steps) {
  std::vector<Step> out;
  std::vector<size_t> round;  // per lane: its steps so far
  for (const Step& st : steps) {
    const size_t lane = static_cast<size_t>(st.lane);
    if (round.size() <= lane) round.resize(lane + 1, 0);
    const size_t k = round[lane]++;
    if (out.size() <= k) out.resize(k + 1);
    out[k].ops.insert(out[k].ops.end(), st.ops.begin(), st.ops.end());
  }
  out.erase(std::remove_if(out.begin(), out.end(), [](const Step& st) { return st.ops.empty(); }), out.end());
  return out;
}

std::vector<std::vector<Step>> align_rounds(const std::vector<int>& members, const std::vector<std::vector<Step>>& lanes) {
  const int n = static_cast<int>(members.size());
  std::vector<int> first(n + 1, 0);  // node id of (member j, step s): first[j] + s
  for (int j = 0; j < n; ++j) first[j + 1] = first[j] + static_cast<int>(lanes[j].size());
  std::vector<int> root(first[n]);
  for (int v = 0; v < first[n]; ++v) root[v] = v;
  auto find = [&](int v) {
    while (root[v] != v) v = root[v] = root[root[v]];
    return v;
  };
  auto member = [&](int rank) {
    const auto at = std::find(members.begin(), members.end(), rank);
    if (at == members.end()) throw std::logic_error("align_rounds: peer " + std::to_string(rank) + " is not a member");
    return static_cast<int>(at - members.begin());
  };
  // Each message joins the steps holding its two ends: sends and receives of an ordered pair meet in order.
  std::map<std::pair<int, int>, std::vector<int>> sends, recvs;  // (from, to) member -> node ids
  for (int j = 0; j < n; ++j)
    for (int st = 0; st < static_cast<int>(lanes[j].size()); ++st)
      for (const Op& o : lanes[j][st].ops) {
        if (o.kind == OpKind::Send) sends[{j, member(o.peer)}].push_back(first[j] + st);
        else if (o.kind == OpKind::Recv || o.kind == OpKind::RecvReduce) recvs[{member(o.peer), j}].push_back(first[j] + st);
      }
  if (sends.size() != recvs.size()) throw std::logic_error("align_rounds: a message without its other end");
  for (const auto& [pair, ids] : sends) {
    const auto at = recvs.find(pair);
    if (at == recvs.end() || at->second.size() != ids.size())
      throw std::logic_error("align_rounds: a message without its other end");
    for (size_t k = 0; k < ids.size(); ++k) root[find(ids[k])] = find(at->second[k]);
  }
  // Longest path over the joined steps, each lane's steps in order (Kahn's order).
  std::vector<std::vector<int>> next(first[n]);
  std::vector<int> indegree(first[n], 0), at_round(first[n], 0);
  for (int j = 0; j < n; ++j)
    for (int v = first[j] + 1; v < first[j + 1]; ++v) {
      const int u = find(v - 1), w = find(v);
      if (u == w) throw std::logic_error("align_rounds: the lanes deadlock");
      next[u].push_back(w);
      ++indegree[w];
    }
  std::vector<int> ready;
  int groups = 0, placed = 0;
  for (int v = 0; v < first[n]; ++v)
    if (find(v) == v) {
      ++groups;
      if (indegree[v] == 0) ready.push_back(v);
    }
  int rounds = 0;
  while (!ready.empty()) {
    const int u = ready.back();
    ready.pop_back();
    ++placed;
    rounds = std::max(rounds, at_round[u] + 1);
    for (int w : next[u]) {
      at_round[w] = std::max(at_round[w], at_round[u] + 1);
      if (--indegree[w] == 0) ready.push_back(w);
    }
  }
  if (placed != groups) throw std::logic_error("align_rounds: the lanes deadlock");
  std::vector<std::vector<Step>> out(n, std::vector<Step>(rounds));
  for (int j = 0; j < n; ++j)
    for (int st = 0; st < static_cast<int>(lanes[j].size()); ++st) out[j][at_round[find(first[j] + st)]] = lanes[j][st];
  return out;
}

}  // namespace sched
}  // namespace commlib
