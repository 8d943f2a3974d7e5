// The cost model's choice of a pipelined hierarchical all_reduce's segments and pieces
// (pipeline_shape.h).
#include "policy/pipeline_shape.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <map>
#include <mutex>
#include <numeric>
#include <string>
#include <set>
#include <utility>
#include <vector>

#include "common/params.h"
#include "common/shapes.h"
#include "policy/model_key.h"
#include "policy/tie_rule.h"
#include "policy/window_shapes.h"
#include "schedule/registry.h"
#include "schedule/side_by_side.h"
#include "sim/rates.h"
#include "sim/simulator.h"
#include "sim/topology.h"

namespace commlib {

namespace {

// A rank's links, each direction: its port inside the host, its NIC across.
enum Link { kPortOut, kPortIn, kNicOut, kNicIn, kLinks };

// The estimate of one rank's schedule (pipeline_shape.h): its steps one after another, each from
// the end of the last; peers in lock step, so a peer's side of a message (its CPU posting it, its
// link serving it) is where the rank's own would be.
double rank_estimate(const Schedule& s, int r, const sim::Topology& t, const sim::RankRates& rates, double f,
                     int elem_bytes) {
  const int h = t.host_of[r];
  // Ranks of this host that share r's NIC (nic_of, by local index), every one as busy as r.
  int same_nic = 0, on_host = 0;
  for (int q = 0; q < t.size(); ++q)
    if (t.host_of[q] == h) ++on_host, same_nic += t.nic_of[q] == t.nic_of[r];
  double bw[kLinks] = {rates.port_Bps, rates.port_Bps, t.nic_Bps / std::max(1, same_nic), t.nic_Bps / std::max(1, same_nic)};
  if (t.intra_bus_Bps > 0)  // the host's bus carries every local rank's bytes
    bw[kPortOut] = bw[kPortIn] = std::min(rates.port_Bps, t.intra_bus_Bps / std::max(1, on_host));
  double free_at[kLinks] = {0, 0, 0, 0}, nic_next[2] = {0, 0};
  double send_cpu = 0, recv_cpu = 0, clock = 0;
  std::vector<double> sent[2];  // this step's sends' wire ends, per link kind (intra, inter)
  for (size_t k = 0; k < s.steps.size(); ++k) {
    const double entry = clock + (k > 0 ? t.step_overhead_s * f : 0.0);
    double end = entry, local = 0;
    sent[0].clear(), sent[1].clear();
    size_t received[2] = {0, 0};
    auto wire = [&](bool inter, bool out, double start, double bytes) {
      if (inter && t.nic_gap_s > 0) {
        double& next = nic_next[out ? 0 : 1];
        start = std::max(start, next);
        next = start + t.nic_gap_s;
      }
      const int link = inter ? (out ? kNicOut : kNicIn) : (out ? kPortOut : kPortIn);
      free_at[link] = std::max(start, free_at[link]) + bytes / bw[link];
      return free_at[link];
    };
    for (int pass = 0; pass < 3; ++pass) {  // sends, then receives from other hosts, then local ones
      for (const Op& o : s.steps[k].ops) {
        const bool send = o.kind == OpKind::Send;
        const bool inter = is_message(o.kind) && t.host_of[o.peer] != h;
        if (!is_message(o.kind) || send != (pass == 0) || (!send && inter != (pass == 1))) continue;
        const double bytes = static_cast<double>(send ? o.src.count : o.dst.count) * elem_bytes;
        const double latency = inter ? t.inter_latency_s : t.intra_latency_s;
        double start = entry + t.op_overhead_s * f;
        const bool device = !inter && t.intra_by_device;  // its overheads its own, off the CPU (sim/run.h)
        if (send) {
          const double posted = device ? entry + t.send_overhead_s * f : (send_cpu = std::max(send_cpu, entry) + t.send_overhead_s * f);
          const double done = wire(inter, true, std::max(start, posted), bytes);
          sent[inter].push_back(done);
          end = std::max(end, done + latency);
          continue;
        }
        const size_t i = received[inter]++;  // the peer posted it as the rank posts its i-th send
        start = std::max(start, entry + static_cast<double>(device ? 1 : i + 1) * t.send_overhead_s * f);
        double done = wire(inter, false, start, bytes);
        if (i < sent[inter].size()) done = std::max(done, sent[inter][i]);
        double taken = done + latency;
        if (device) taken += t.recv_overhead_s * f;
        else if (t.recv_overhead_s > 0) taken = recv_cpu = std::max(recv_cpu, taken) + t.recv_overhead_s * f;
        if (o.kind == OpKind::RecvReduce && bytes > 0) {  // as sim::reduce_tail_s
          const double chunks = t.chunk_bytes > 0 ? std::ceil(bytes / static_cast<double>(t.chunk_bytes)) : 1.0;
          const double c = bytes / chunks, beta = 1.0 / bw[inter ? kNicIn : kPortIn], gamma = rates.reduce_s_per_byte;
          taken += c * gamma + (chunks - 1) * c * (std::max(beta, gamma) - beta);
        }
        end = std::max(end, taken);
      }
    }
    for (const Op& o : s.steps[k].ops) {
      const double bytes = static_cast<double>(o.dst.count) * elem_bytes;
      if (o.kind == OpKind::Copy && (o.src.buf != o.dst.buf || o.src.offset != o.dst.offset))
        local += bytes * rates.copy_s_per_byte;  // a copy onto itself is skipped (sim/compact.cc)
      if (o.kind == OpKind::Reduce) local += bytes * rates.reduce_s_per_byte;
    }
    clock = end + local;
  }
  return clock;
}

// The chosen shapes, per (call, candidate, placed model): one choice builds up to 34 schedules of
// every local rank's lanes (seconds at 32 ranks), and the candidate search, the ranking and the
// bounds ask for the same one in turn. The key holds everything the choice depends on. An entry
// that is not `exact` is choose_simulated_shape's "no shape within estimate_s" (every shape slower).
struct ShapeMemo {
  Composition shape;
  double estimate_s;
  bool exact = true;
  double least_s = -1;  // choose_simulated_shape's: the least of the shapes' times (-1: estimate_s)
};
std::mutex g_memo_mu;
std::map<std::string, ShapeMemo> g_memo;
constexpr size_t kMemoEntries = 4096;

bool spans_hosts(const sim::Topology& t) {
  return std::set<int>(t.host_of.begin(), t.host_of.end()).size() > 1;
}

}  // namespace

double pipeline_estimate(const CallShape& call, const Composition& cand, const sim::Topology& t) {
  const int P = t.size();
  CollArgs a = call.args_on(t.host_of);
  const std::vector<double> oversub = sim::oversubscription(t);
  double worst = 0;
  for (int r : std::set<int>{0, P - 1}) {
    a.rank = r;
    const Schedule s = build_schedule(a, cand);
    std::vector<int64_t> scratch(P, 0);
    scratch[r] = s.scratch_count;
    sim::Result ignored;
    const std::vector<sim::RankRates> rates = sim::rank_rates(t, call.coll, call.count, call.elem_bytes, a.root, scratch, ignored);
    worst = std::max(worst, rank_estimate(s, r, t, rates[r], oversub[t.host_of[r]], call.elem_bytes));
  }
  return worst;
}

namespace {

// The rail rings' shares rail_split is estimated at (1/kShareUnits of the buffer): from half to all
// of it, finest around the NIC/port balance of the DGX presets (0.84: docs/simulator.md).
constexpr int kShares[] = {512, 640, 768, 832, 860, 896, 928, 960, 992, 1024};

// The memo's key, lookup and store, shared by both choices below.
std::string memo_key(const CallShape& call, const Composition& cand, const sim::Topology& t) {
  KeyWriter key;
  key.add_call(call);
  for (const std::string& v : {cand.algorithm, cand.inter, cand.intra}) key.add(v);
  key.add_model(t);
  return key.k;
}

bool memo_find(const std::string& key, ShapeMemo* hit) {
  std::lock_guard<std::mutex> lk(g_memo_mu);
  const auto it = g_memo.find(key);
  if (it == g_memo.end()) return false;
  *hit = it->second;
  return true;
}

Composition memo_store(const std::string& key, const ShapeMemo& m) {
  std::lock_guard<std::mutex> lk(g_memo_mu);
  if (g_memo.size() >= kMemoEntries) g_memo.clear();
  g_memo.insert_or_assign(key, m);
  return m.shape;
}

// The memoised choice of (call, cand) on t: the kept one, else `choose(&estimate)`'s, then kept.
// Every choice below goes through it (one key, one lookup, one store).
template <class Choose>
Composition memoised(const CallShape& call, const Composition& cand, const sim::Topology& t, double* estimate_s,
                     Choose choose) {
  const std::string key = memo_key(call, cand, t);
  ShapeMemo hit;
  if (memo_find(key, &hit) && hit.exact) {
    if (estimate_s) *estimate_s = hit.estimate_s;
    return hit.shape;
  }
  double best_s = std::numeric_limits<double>::infinity();
  const Composition best = choose(&best_s);
  if (estimate_s) *estimate_s = best_s;
  return memo_store(key, ShapeMemo{best, best_s});
}

// The shape of the estimates picked by the tie rule (tie_rule.h: the first of the list within the tie of
// the smallest), its estimate in *best_s; `none` (with *best_s untouched) when no estimate is finite.
Composition pick_estimated(const Composition& none, const std::vector<Composition>& tried,
                           const std::vector<double>& estimates, double* best_s) {
  const size_t j = tie_pick(estimates);
  if (j >= tried.size()) return none;
  *best_s = estimates[j];
  return tried[j];
}

// rail_split's share and its hierarchical part's shape (pipeline_shape.h): the part's (K, pieces)
// as hierarchical's own choice for its count at the default share, then the share of the smallest
// estimate with K segments of the part's count at that share.
Composition choose_split_share(const CallShape& call, const Composition& cand, const sim::Topology& t,
                               double* estimate_s) {
  return memoised(call, cand, t, estimate_s, [&](double* best_s) {
    CallShape rest = call;
    rest.count = call.count - sched::share_of(call.count, sched::kDefaultShare);
    const Composition hier = choose_pipeline_shape(rest, Composition{"hierarchical", cand.inter, cand.intra}, t);
    const int64_t K = hier.segment > 0 ? std::clamp<int64_t>(rest.count / hier.segment, 1, 16) : 1;
    std::vector<Composition> tried;
    std::vector<double> estimates;
    for (int share : kShares) {
      Composition k = cand;
      const int64_t part = call.count - sched::share_of(call.count, share);
      k.segment = K > 1 && part / K > 0 ? part / K : 0;
      k.pieces = hier.pieces, k.share = share;
      tried.push_back(k);
      estimates.push_back(pipeline_estimate(call, k, t));
    }
    return pick_estimated(cand, tried, estimates, best_s);
  });
}

// rail_halving's segments (schedule/rail_halving.cc): K in {1, 2, 4, 8, 16}, as hierarchical's (its
// pieces are its own: it pairs its lanes uncut), the smallest estimate.
Composition choose_halving_segments(const CallShape& call, const Composition& cand, const sim::Topology& t,
                                    double* estimate_s) {
  return memoised(call, cand, t, estimate_s, [&](double* best_s) {
    Composition none = cand;
    none.segment = 0, none.pieces = 0;
    std::vector<Composition> tried;
    std::vector<double> estimates;
    for (int K : {1, 2, 4, 8, 16}) {
      const int64_t segment = K == 1 ? 0 : call.count / K;
      if (K > 1 && (segment < 1 || std::min<int64_t>(call.count / segment, 16) != K)) continue;
      Composition k = cand;
      k.segment = segment, k.pieces = 0;
      tried.push_back(k);
      estimates.push_back(pipeline_estimate(call, k, t));
    }
    return pick_estimated(none, tried, estimates, best_s);
  });
}

// rail_lanes' lanes and segments (schedule/rail_lanes.cc): choose_simulated_shape with nothing to
// beat. Without shapes to try (a buffer too small for them) the composition unshaped, estimate
// infinite, as before.
Composition choose_lane_shape(const CallShape& call, const Composition& cand, const sim::Topology& t,
                              double* estimate_s) {
  Composition best = cand;
  best.segment = 0, best.pieces = 0;
  double best_s = std::numeric_limits<double>::infinity();
  choose_simulated_shape(call, cand, t, std::numeric_limits<double>::infinity(), {}, &best, &best_s);
  if (estimate_s) *estimate_s = best_s;
  return best;
}

}  // namespace

Composition choose_pipeline_shape(const CallShape& call, const Composition& cand, const sim::Topology& t,
                                  double* estimate_s) {
  if (estimate_s) *estimate_s = -1;
  if (call.coll == Collective::AllReduce && cand.algorithm == "rail_split" && spans_hosts(t) &&
      !param_set("COMMLIB_HIER_SEGMENT"))
    return choose_split_share(call, cand, t, estimate_s);
  if (call.coll == Collective::AllReduce && cand.algorithm == "rail_halving" && spans_hosts(t) &&
      !param_set("COMMLIB_HIER_SEGMENT"))
    return choose_halving_segments(call, cand, t, estimate_s);
  if (shape_is_simulated(call, cand, t)) return choose_lane_shape(call, cand, t, estimate_s);
  if (call.coll != Collective::AllReduce || cand.algorithm != "hierarchical" || !spans_hosts(t)) return cand;
  if (param_set("COMMLIB_HIER_SEGMENT")) return cand;  // the user's segment, as the setting says
  // The shapes to try: the builder's segments are count / segment, at most 16
  // (hierarchical_layout.h, pipeline_segments); pieces only cut the overlapped pipeline, which runs
  // on hosts of equal size (elsewhere every cap builds the same schedule: only 1 is tried).
  std::map<int, int> ranks_per_host;
  for (int h : t.host_of) ++ranks_per_host[h];
  const bool equal = std::all_of(ranks_per_host.begin(), ranks_per_host.end(),
                                 [&](const auto& hn) { return hn.second == ranks_per_host.begin()->second; });
  std::vector<std::pair<int64_t, int>> shapes = {{0, 0}};  // not pipelined
  for (int K : {2, 4, 8, 16}) {
    const int64_t segment = call.count / K;
    if (segment < 1 || std::min<int64_t>(call.count / segment, 16) != K) continue;
    for (int pieces : {1, 2, 4, 8})
      if (pieces == 1 || equal) shapes.emplace_back(segment, pieces);
  }
  Composition unshaped = cand;
  unshaped.segment = 0, unshaped.pieces = 0;
  if (shapes.size() == 1 && !estimate_s) return unshaped;
  return memoised(call, cand, t, estimate_s, [&](double* best_s) {
    std::vector<Composition> tried;
    std::vector<double> estimates;
    for (const auto& [segment, pieces] : shapes) {
      Composition k = cand;
      k.segment = segment, k.pieces = pieces;
      tried.push_back(k);
      estimates.push_back(pipeline_estimate(call, k, t));
    }
    return pick_estimated(unshaped, tried, estimates, best_s);
  });
}

bool shape_is_simulated(const CallShape& call, const Composition& cand, const sim::Topology& t) {
  return call.coll == Collective::AllReduce && (cand.algorithm == "rail_lanes" || cand.algorithm == "rail_window") &&
         spans_hosts(t) && !param_set("COMMLIB_HIER_SEGMENT");
}

// rail_lanes' shapes: its lanes overlap, which the one-rank estimate (steps one after another)
// cannot see, so each shape is simulated: W in {2, 4, 8} lanes of K in {1, 2, 4, 8, 16} segments
// each (from K 4 also ramped, below 4096 ranks), W K at most 128, 64 from 512 ranks (a run plays W K segments of 2 log2 P messages a rank);
// from 4096 ranks only six, each run taking minutes there: 4 lanes of 1 or 2 segments, of 4 and 16
// segments ramped only, 8 x 2 and 2 x 16 (until session 22 only 4 x 2, 4 x 4 and 8 x 2: at 1024
// dgx-h100 nodes and 1 GiB 2 x 16 gives 360.2 GB/s and 4 x 8 351.6, where rail_halving's 16 segments,
// auto's pick then, give 338.5; session 24: 4 x 4 and 4 x 8 ramped in place of equal, below).
std::vector<Composition> simulated_shapes(const CallShape& call, const Composition& cand, const sim::Topology& t) {
  if (cand.algorithm == "rail_window") return window_shapes(call, cand, t);
  std::vector<Composition> out;
  const bool huge = t.size() >= 4096;  // minutes a shape: the six nearest the NICs' balance
  const int most = huge ? 64 : t.size() >= 512 ? 64 : 128;
  for (int W : {4, 8, 2})
    for (int K : {4, 2, 8, 16, 1}) {
      const int64_t segment = K == 1 ? 0 : call.count / W / K;
      // (session 24: 4 x 16 ramped in place of 4 x 8: 374.8 GB/s at 1024 dgx-h100 nodes and 1 GiB
      // against 367.5; at 64 MiB neither is the best, 4 x 4 ramped is)
      const bool huge_shape = (W == 4 && K != 8) || (W == 8 && K == 2) || (W == 2 && K == 16);
      if (W * K > most || (huge && !huge_shape) || (K > 1 && segment < 1)) continue;
      Composition k = cand;
      k.segment = segment, k.pieces = W;
      // Session 24: from 4096 ranks 4 x 4 and 4 x 8 (now 4 x 16) are played ramped instead of equal, so the six runs
      // stay six. At 1024 dgx-h100 nodes the ramp is what wins there (64 MiB: 4 x 4 ramped 300.9 GB/s,
      // the best equal shape 295.3; 1 GiB: 4 x 8 ramped 367.5, the best equal 2 x 16 360.2; 4 x 4 equal, the
      // pick at 64 MiB before, loses to its ramp), so the ramp of the best equal shape is not needed
      // (rails23b played both forms: eight runs, +47 % of the search's CPU; docs/simulator.md "Session 24").
      if (huge && W == 4 && K >= 4) k.share = 1;
      out.push_back(k);
      // Session 23: below 4096 ranks each shape of 4 segments or more also ramped (share 1: a lane's
      // first and last segment in halves, rail_halving.cc), which shrinks the fill and drain the
      // lanes share (docs/simulator.md "Session 23"); deeper ramps were slower where measured.
      if (!huge && K >= 4) {
        k.share = 1;
        out.push_back(k);
      }
    }
  return out;
}

bool choose_simulated_shape(const CallShape& call, const Composition& cand, const sim::Topology& t, double beat_s,
                            const std::vector<double>& bounds, Composition* shape, double* time_s, int* runs,
                            int* cut) {
  if (runs) *runs = 0;
  if (cut) *cut = 0;
  const std::string key = memo_key(call, cand, t);
  ShapeMemo hit;
  if (memo_find(key, &hit)) {
    if (hit.exact && (hit.least_s >= 0 ? hit.least_s : hit.estimate_s) <= tie_limit(beat_s)) {
      *shape = hit.shape, *time_s = hit.estimate_s;
      return true;
    }
    if (hit.exact || beat_s <= hit.estimate_s) return false;  // every shape slower than beat_s
  }
  const std::vector<Composition> shapes = simulated_shapes(call, cand, t);
  // With bounds, the shapes in bound order (the likely best first, so that the others stop early);
  // equal times go to the earlier shape of the list either way.
  std::vector<size_t> order(shapes.size());
  std::iota(order.begin(), order.end(), size_t{0});
  if (bounds.size() == shapes.size())
    std::stable_sort(order.begin(), order.end(), [&](size_t x, size_t y) { return bounds[x] < bounds[y]; });
  // The tie rule (tie_rule.h) twice over: a shape found ties with beat_s or beats it (its least time
  // within tie_limit(beat_s)), and the pick among the shapes is the first within the tie of their least,
  // so every shape up to tie_limit(tie_limit(beat_s)) runs to its end and the pick is the one simulating
  // every shape gives.
  std::vector<double> times(shapes.size(), std::numeric_limits<double>::infinity());
  double least = std::numeric_limits<double>::infinity();
  for (size_t j : order) {
    const double limit = std::min(tie_limit(least), tie_limit(tie_limit(beat_s)));
    if (j < bounds.size() && bounds[j] > limit) continue;  // it cannot finish within the limit
    sim::Options o;
    o.stop_after_s = limit;  // a run past it can be picked neither here nor by the search (ties still finish)
    const sim::Result r = sim::simulate(call.coll, shapes[j], call.count, call.elem_bytes, call.root, t, o);
    if (runs) ++*runs;
    if (r.cut && cut) ++*cut;
    if (!r.cut) times[j] = r.time_s, least = std::min(least, r.time_s);
  }
  const size_t pick = tie_pick(times);
  if (pick >= shapes.size() || least > tie_limit(beat_s)) {  // every shape slower than beat_s's tie (none at all: an infinite beat_s is never met)
    if (!shapes.empty() && beat_s < std::numeric_limits<double>::infinity()) memo_store(key, ShapeMemo{cand, beat_s, false});
    return false;
  }
  // The pick among the shapes within the tie of beat_s is the pick among all: every other one was slower.
  *shape = memo_store(key, ShapeMemo{shapes[pick], times[pick], true, least});
  *time_s = times[pick];
  return true;
}

void clear_pipeline_shapes() {
  std::lock_guard<std::mutex> lk(g_memo_mu);
  g_memo.clear();
}

}  // namespace commlib
