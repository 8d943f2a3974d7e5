// auto's branch-and-bound search over the cost model's candidates (candidate_search.h).
#include "policy/candidate_search.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <map>
#include <mutex>
#include <numeric>
#include <set>

#include "policy/model_key.h"
#include "policy/pipeline_shape.h"
#include "policy/tie_rule.h"
#include "schedule/lanes.h"
#include "schedule/registry.h"
#include "sim/simulator.h"

namespace commlib {

namespace {

// Built-ins a host engine runs: not registered from Python, not one-sided (registry.h kOneSided).
bool is_host_builtin(const AlgorithmSpec& s) { return !(s.traits & (kUserDefined | kOneSided)); }

struct Tally {
  int64_t messages = 0;
  double bytes = 0;
};

// The search's cache key: the call's shape, its segment and search settings, and every field of the
// placed model (model_key.h).
std::string cache_key(const CallShape& call, int64_t segment, bool hier_only, int64_t extrapolate_ops,
                      const sim::Topology& t) {
  KeyWriter w;
  w.add_call(call);
  for (int64_t v : {segment, static_cast<int64_t>(hier_only), extrapolate_ops}) w.add(v);
  w.add_model(t);
  return w.k;
}

std::mutex g_cache_mu;
std::map<std::string, AlgorithmChoice> g_cache;
constexpr size_t kCacheEntries = 1024;

}  // namespace

std::vector<std::string> intra_candidates(Collective c) {
  auto builtin_flat = [](Collective k) {
    std::vector<std::string> names;
    for (const AlgorithmSpec& s : algorithm_specs(k))
      if (is_host_builtin(s) && s.name != "hierarchical" && s.name != "direct" && s.name != "rail_halving" &&
          s.name != "rail_lanes")
        names.push_back(s.name);
    return names;
  };
  switch (c) {
    case Collective::AllReduce: {
      std::vector<std::string> both;
      const std::vector<std::string> ag = builtin_flat(Collective::AllGather);
      for (const std::string& n : builtin_flat(Collective::ReduceScatter))
        if (std::find(ag.begin(), ag.end(), n) != ag.end()) both.push_back(n);
      return both;
    }
    case Collective::AllGather:
    case Collective::ReduceScatter:
    case Collective::Broadcast:
      return builtin_flat(c);
    default:
      return {};
  }
}

std::vector<Composition> candidate_list(Collective c, const std::vector<int>& host_of, int64_t segment,
                                        int64_t bytes) {
  std::set<int> ids;
  bool shares = false;
  for (int h : host_of) shares |= !ids.insert(h).second;
  std::vector<Composition> out;
  std::vector<std::string> flat;
  bool has_hier = false, has_split = false, has_halving = false, has_lanes = false, has_window = false;
  for (const AlgorithmSpec& s : algorithm_specs(c)) {
    if (!is_host_builtin(s)) continue;
    if (s.name == "hierarchical") has_hier = true;
    else if (s.name == "rail_split") has_split = true;
    else if (s.name == "rail_halving") has_halving = true;  // a hierarchical schedule: not a phase of one
    else if (s.name == "rail_lanes") has_lanes = true;
    else if (s.name == "rail_window") has_window = true;
    else flat.push_back(s.name);
  }
  for (const std::string& f : flat) out.push_back(Composition{f, "", "", 0});
  if (has_hier && ids.size() > 1 && shares) {
    out.push_back(Composition{"hierarchical", "", "", segment});
    for (const std::string& f : flat) out.push_back(Composition{"hierarchical", f, "", segment});
    for (const std::string& x : intra_candidates(c))
      for (const std::string& f : flat) out.push_back(Composition{"hierarchical", f, x, segment});
  }
  // rail_split beside each hierarchical composition, where its two parts run side by side (hosts of
  // equal size, schedule/side_by_side.h); one after another it is never faster than its parts.
  std::map<int, int> per_host;
  for (int h : host_of) ++per_host[h];
  const bool equal = std::all_of(per_host.begin(), per_host.end(), [&](const auto& e) { return e.second == per_host.begin()->second; });
  if (has_split && has_hier && ids.size() > 1 && shares && equal && (bytes < 0 || bytes >= kSplitMinBytes)) {
    const size_t hier_end = out.size();
    for (size_t i = flat.size(); i < hier_end; ++i) {
      Composition k = out[i];
      k.algorithm = "rail_split";
      out.push_back(k);
    }
  }
  // rail_halving (schedule/rail_halving.cc) where hierarchical is ranked: its own pipelined shape;
  // rail_lanes (rail_lanes.cc) where it pairs (equal power-of-two hosts): rail_halving in lanes;
  // rail_window (rail_window.cc) there too: a lane per segment under a window of steps in flight.
  if (has_halving && ids.size() > 1 && shares) out.push_back(Composition{"rail_halving", "", "", segment});
  if (ids.size() > 1 && shares && equal && per_host.size() >= 2 && (bytes < 0 || bytes >= kLanesMinBytes) &&
      (per_host.size() & (per_host.size() - 1)) == 0 && per_host.begin()->second >= 2 &&
      (per_host.begin()->second & (per_host.begin()->second - 1)) == 0) {
    if (has_lanes) out.push_back(Composition{"rail_lanes", "", "", segment});
    // (from 4096 ranks only below 512 MiB: at 1 GiB rail_lanes wins wherever both were played, 128
    // dgx-h100 nodes 379.8 against 377.3 GB/s, and rail_window's run there cost +25 % of the search's
    // CPU at 4096 ranks though cut: docs/simulator.md "A window of steps in flight")
    const bool huge = host_of.size() >= 4096 && (bytes < 0 || bytes >= kWindowHugeMaxBytes);
    if (has_window && !huge) out.push_back(Composition{"rail_window", "", "", segment});
  }
  return out;
}

double candidate_lower_bound(const CallShape& call, const Composition& cand, const sim::Topology& t,
                             int64_t* ops_per_rank) {
  if (ops_per_rank) *ops_per_rank = 0;
  const int P = t.size();
  // The fastest a port ever moves bytes (in cache or any memory tier; sharing a core only slows it).
  double port = t.intra_port_Bps;
  for (const auto& m : t.memory_tiers) port = std::max(port, m.port_Bps);
  // Likewise the fastest copy and reduction: a step's local ops run after its transfers, one after
  // another (simulator.cc, finish_step), and a reducing receive ends with at least one chunk's
  // reduction. Without them a reduce_scatter's bound was 10-16 % under its prediction (its ordered
  // reductions), so every near candidate was simulated.
  double copy_spb = t.copy_s_per_byte, reduce_spb = t.reduce_s_per_byte;
  for (const auto& m : t.memory_tiers) {
    copy_spb = std::min(copy_spb, m.copy_s_per_byte);
    reduce_spb = std::min(reduce_spb, m.reduce_s_per_byte);
  }
  const double nic_step_Bps = t.nic_burst_bytes > 0 ? std::numeric_limits<double>::infinity() : t.nic_Bps;
  CollArgs a = call.args_on(t.host_of);
  a.compose(cand);
  const int lanes = schedule_lanes(a, cand.algorithm);  // schedule/lanes.h: lanes overlap
  double bound = 0;
  for (int r : {0, a.root, P / 2, P - 1}) {
    a.rank = r;
    const Schedule s = build_schedule(a, cand);
    double rank_time = 0, inter_out = 0, inter_in = 0, intra_out = 0, intra_in = 0, slowest_lane = 0;
    std::vector<double> lane_time(lanes > 1 ? lanes : 0);  // a lane's steps wait for none of another's
    int64_t ops = 0;
    for (size_t k = 0; k < s.steps.size(); ++k) {
      const int lane = lanes > 1 ? s.steps[k].lane : 0;
      if (lanes > 1) std::swap(rank_time, lane_time[lane]);  // this step adds to its own lane's time
      // What this step's communication must at least take after the rank entered it (sim/simulator.h):
      // each transfer its latency and bytes at the fastest rate; the rank's sends one after another
      // (send overhead), its receives likewise (receive overhead); all its bytes through its one
      // port (inside a host) or its NIC (across), each direction; its NIC's message gap.
      Tally send[2], recv[2];  // [0] same host, [1] other hosts
      double step = 0, local = 0;
      for (const Op& o : s.steps[k].ops) {
        const double local_bytes = static_cast<double>(o.dst.count) * call.elem_bytes;
        if (o.kind == OpKind::Copy && (o.src.buf != o.dst.buf || o.src.offset != o.dst.offset))
          local += local_bytes * copy_spb;  // a copy onto itself is skipped (sim/compact.cc)
        if (o.kind == OpKind::Reduce) local += local_bytes * reduce_spb;
        if (o.kind != OpKind::Send && o.kind != OpKind::Recv && o.kind != OpKind::RecvReduce) continue;
        ++ops;
        const double bytes = static_cast<double>(o.kind == OpKind::Send ? o.src.count : o.dst.count) * call.elem_bytes;
        const int inter = t.host_of[r] != t.host_of[o.peer];
        // A NIC with a token bucket passes a message's bytes at once while tokens last; its rate
        // only bounds the call as a whole (below: the bucket starts empty).
        double bw = inter ? nic_step_Bps : port;
        if (!inter && t.intra_bus_Bps > 0) bw = std::min(bw, t.intra_bus_Bps);
        double tail = 0;  // a reducing receive's last chunk reduced after its bytes are in
        if (o.kind == OpKind::RecvReduce && bytes > 0)
          tail = (t.chunk_bytes > 0 ? bytes / std::ceil(bytes / static_cast<double>(t.chunk_bytes)) : bytes) * reduce_spb;
        step = std::max(step, t.op_overhead_s + (inter ? t.inter_latency_s : t.intra_latency_s) + bytes / bw + tail);
        Tally& tally = (o.kind == OpKind::Send ? send : recv)[inter];
        ++tally.messages;
        tally.bytes += bytes;
      }
      const double latency[2] = {t.intra_latency_s, t.inter_latency_s};
      const double rate[2] = {t.intra_bus_Bps > 0 ? std::min(port, t.intra_bus_Bps) : port, nic_step_Bps};
      inter_out += send[1].bytes, inter_in += recv[1].bytes;
      intra_out += send[0].bytes, intra_in += recv[0].bytes;
      // The CPU's messages, one after another: inside a host moved by the devices (intra_by_device)
      // they are not its (each pays its own overheads, in parallel: a lower bound still without them).
      const int64_t own = t.intra_by_device ? 0 : 1;
      const int64_t sends = own * send[0].messages + send[1].messages, recvs = own * recv[0].messages + recv[1].messages;
      const double send_latency = send[0].messages ? latency[0] : latency[1];
      const double recv_latency = recv[0].messages ? latency[0] : latency[1];
      if (sends) step = std::max(step, std::max(t.op_overhead_s, sends * t.send_overhead_s) + std::min(send_latency, latency[1]));
      if (recvs) step = std::max(step, t.op_overhead_s + std::min(recv_latency, latency[1]) + recvs * t.recv_overhead_s);
      for (int x = 0; x < 2; ++x)
        for (const Tally* d : {&send[x], &recv[x]})
          if (d->messages) {
            step = std::max(step, t.op_overhead_s + latency[x] + d->bytes / rate[x]);
            if (x == 1) step = std::max(step, t.op_overhead_s + (d->messages - 1) * t.nic_gap_s + latency[1]);
          }
      rank_time += step + local + (k > 0 ? t.step_overhead_s : 0.0);
      if (lanes > 1) {
        std::swap(rank_time, lane_time[lane]);
        slowest_lane = std::max(slowest_lane, lane_time[lane]);
      }
    }
    if (lanes > 1)  // the slowest lane, and every lane's bytes through the rank's port
      rank_time = std::max({rank_time, slowest_lane, std::max(intra_out, intra_in) / (t.intra_bus_Bps > 0 ? std::min(port, t.intra_bus_Bps) : port)});
    // Every byte the rank's NIC carries across hosts, each direction, at its rate: the rank's own and
    // those of the ranks that share its NIC (nic_of: the 4-NIC hosts put two ranks on each). Before
    // session 27 only the rank's own bytes, and only for laned or bucketed calls: on NIC-shared
    // hosts every bound was about half its candidate's time, none was skipped, and auto's search
    // at 128 dgx-a100-4nic nodes ran ~10 CPU minutes a point.
    if (inter_out + inter_in > 0) {
      double nic_out = inter_out, nic_in = inter_in;
      for (int q = 0; q < P; ++q) {
        if (q == r || t.host_of[q] != t.host_of[r] || t.nic_of[q] != t.nic_of[r]) continue;
        a.rank = q;
        for (const Step& st : build_schedule(a, cand).steps)
          for (const Op& o : st.ops)
            if ((o.kind == OpKind::Send || o.kind == OpKind::Recv || o.kind == OpKind::RecvReduce) &&
                t.host_of[q] != t.host_of[o.peer])
              (o.kind == OpKind::Send ? nic_out : nic_in) +=
                  static_cast<double>(o.kind == OpKind::Send ? o.src.count : o.dst.count) * call.elem_bytes;
      }
      rank_time = std::max(rank_time, std::max(nic_out, nic_in) / t.nic_Bps);
    }
    bound = std::max(bound, rank_time);
    if (ops_per_rank) *ops_per_rank = std::max(*ops_per_rank, ops);
  }
  return bound;
}

namespace {

// Pipeline segments of a hierarchical all_reduce (schedule/hierarchical_all_reduce.cc,
// pipeline_segments: the builder's own rule, repeated here to plan the extrapolation).
int64_t hier_segments(const CallShape& call, int64_t segment, const sim::Topology& t) {
  if (call.coll != Collective::AllReduce || t.hosts() < 2 || segment <= 0) return 1;
  return std::clamp<int64_t>(call.count / segment, 1, 16);
}

// The steady-state estimate of a K-segment candidate (candidate_search.h): its first 3 and 4
// segments simulated at the full run's segment length (the overlapped pipeline has its first tick
// with all three phases at K = 3, so T(3) - T(2) still holds fill: 20 % over the steady tick).
double extrapolated_time(const CallShape& call, const Composition& cand, int64_t segments, const sim::Topology& t) {
  const int64_t len = call.count / segments;
  Composition first = cand;
  first.segment = len;
  double at[2];
  for (int m : {3, 4}) at[m - 3] = sim::simulate(call.coll, first, m * len, call.elem_bytes, call.root, t).time_s;
  return at[1] + static_cast<double>(segments - 4) * (at[1] - at[0]);
}

}  // namespace

AlgorithmChoice search_best_candidate(const CallShape& call, const std::vector<int>& host_of,
                                      const sim::Topology& model, bool hier_only, SearchStats* stats,
                                      int64_t extrapolate_ops, int64_t costly_ops) {
  SearchStats local;
  SearchStats& st = stats ? *stats : local;
  st = SearchStats{};
  const int64_t segment = hier_segment_setting();
  const sim::Topology topo = placed_model(model, host_of);
  const std::string key = cache_key(call, segment, hier_only, extrapolate_ops, topo) + "|" + std::to_string(costly_ops);
  {
    std::lock_guard<std::mutex> lk(g_cache_mu);
    auto it = g_cache.find(key);
    if (it != g_cache.end()) {
      st.cached = true;
      return it->second;
    }
  }
  // A candidate whose shape is chosen by simulating its shapes (rail_lanes: pipeline_shape.h) keeps
  // them for its turn: its bound is the least of theirs, and at its turn only the shapes whose bound
  // is within the best so far are simulated, each run stopped past it (at 4096 ranks and 1 MiB its
  // shapes took three runs of seconds each before the search began, for a candidate that loses).
  std::vector<Composition> cands;
  std::vector<std::vector<Composition>> shapes;  // per candidate: its shapes to simulate, or none
  for (const auto& c : candidate_list(call.coll, host_of, segment, call.count * call.elem_bytes)) {
    if (hier_only && c.algorithm != "hierarchical") continue;
    std::vector<Composition> own = shape_is_simulated(call, c, topo) ? simulated_shapes(call, c, topo) : std::vector<Composition>{};
    cands.push_back(own.empty() ? choose_pipeline_shape(call, c, topo) : c);
    shapes.push_back(std::move(own));
  }
  st.candidates = static_cast<int>(cands.size());
  std::vector<double> bound(cands.size());
  std::vector<std::vector<double>> shape_bounds(cands.size());
  std::vector<bool> big(cands.size(), false), costly(cands.size(), false);
  for (size_t i = 0; i < cands.size(); ++i) {
    const bool hier = cands[i].algorithm == "hierarchical";
    int64_t ops = 0;
    if (shapes[i].empty()) {
      bound[i] = candidate_lower_bound(call, cands[i], topo, &ops);
    } else {
      bound[i] = std::numeric_limits<double>::infinity();
      for (const Composition& k : shapes[i]) {
        int64_t own_ops = 0;
        shape_bounds[i].push_back(candidate_lower_bound(call, k, topo, &own_ops));
        bound[i] = std::min(bound[i], shape_bounds[i].back());
        ops = std::max(ops, own_ops);
      }
    }
    costly[i] = costly_ops > 0 && ops * topo.size() >= costly_ops;
    big[i] = hier && extrapolate_ops > 0 && ops * topo.size() >= extrapolate_ops &&
             hier_segments(call, cands[i].segment, topo) >= 5;
  }
  std::vector<size_t> order(cands.size());
  std::iota(order.begin(), order.end(), size_t{0});
  // Cheap candidates first (in bound order), then the costly ones (in bound order): a cheap one that
  // wins sets the time the costly ones must beat before they are built, and their bounds are tight
  // (within 0.5 % on the presets), so most are never built. The order changes only the work: every
  // candidate not ruled out by its bound is still simulated (or cut once it cannot win).
  std::stable_sort(order.begin(), order.end(), [&](size_t x, size_t y) {
    return costly[x] != costly[y] ? costly[y] : bound[x] < bound[y];
  });
  // Every candidate's time that may still tie with the best (tie_rule.h): runs stop, and bounds skip,
  // only past tie_limit(best so far), so each candidate within the tie of the final best is here and
  // the pick among them is the full ranking's (the first in candidate_list order within the tie).
  std::vector<double> times(cands.size(), std::numeric_limits<double>::infinity());
  double best_t = std::numeric_limits<double>::infinity();
  auto take = [&](size_t i, double time_s) {
    times[i] = time_s;
    best_t = std::min(best_t, time_s);
  };
  auto simulate_whole = [&](size_t i) {
    if (!shapes[i].empty()) {  // its shapes now, within the best so far; the best of them taken as simulated
      Composition shape;
      double time_s = 0;
      int runs = 0, cut = 0;
      const bool found = choose_simulated_shape(call, cands[i], topo, best_t, shape_bounds[i], &shape, &time_s, &runs, &cut);
      st.simulated += runs, st.cut += cut;
      if (found) {
        cands[i] = shape;
        take(i, time_s);
      }
      return;
    }
    sim::Options o;
    o.stop_after_s = tie_limit(best_t);  // a run past it can neither win nor tie (a tie still finishes)
    const sim::Result r = sim::simulate(call.coll, cands[i], call.count, call.elem_bytes, call.root, topo, o);
    ++st.simulated;
    if (r.cut) ++st.cut;
    else take(i, r.time_s);
  };
  // Pass 1, in bound order: small candidates simulated whole, large pipelined ones estimated.
  std::vector<std::pair<double, size_t>> estimated;  // (estimate, candidate)
  double best_estimate = std::numeric_limits<double>::infinity();
  for (size_t i : order) {
    if (bound[i] > std::min(tie_limit(best_t), best_estimate * (1 + kExtrapolationMargin))) continue;
    if (!big[i]) {
      simulate_whole(i);
      continue;
    }
    const double e = extrapolated_time(call, cands[i], hier_segments(call, cands[i].segment, topo), topo);
    ++st.extrapolated;
    estimated.emplace_back(e, i);
    best_estimate = std::min(best_estimate, e);
  }
  // Pass 2: the estimated candidates close to the best are simulated whole (exact), the others
  // dropped; a lone close one with no simulated candidate close to it is taken at its estimate.
  std::stable_sort(estimated.begin(), estimated.end());
  const double reference = std::min(best_t, best_estimate);
  std::vector<size_t> close;
  for (const auto& [e, i] : estimated)
    if (e <= reference * (1 + kExtrapolationMargin)) close.push_back(i);
  if (close.size() == 1 && best_t > best_estimate * (1 + kExtrapolationMargin)) {
    take(close[0], best_estimate);
  } else {
    for (size_t i : close) {
      ++st.confirmed;
      simulate_whole(i);
    }
  }
  AlgorithmChoice best;
  const size_t pick = tie_pick(times);
  if (pick < cands.size()) {
    static_cast<Composition&>(best) = cands[pick];
    best.predicted_s = times[pick];
    best.source = "model";
  }
  std::lock_guard<std::mutex> lk(g_cache_mu);
  if (g_cache.size() >= kCacheEntries) g_cache.clear();
  g_cache.emplace(key, best);
  return best;
}

void clear_candidate_cache() {
  {
    std::lock_guard<std::mutex> lk(g_cache_mu);
    g_cache.clear();
  }
  clear_pipeline_shapes();
}

}  // namespace commlib
