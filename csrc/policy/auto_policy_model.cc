// The one resolution of a call's algorithm (auto_policy.h, resolve_algorithm): override, measured
// tuning table, then the cost model (the simulator on this communicator's placement), then the
// link-kind rule.
#include <cstdio>
#include <limits>
#include <set>

#include "common/params.h"
#include "policy/auto_policy.h"
#include "policy/candidate_search.h"
#include "policy/pipeline_shape.h"
#include "policy/tie_rule.h"
#include "schedule/registry.h"
#include "sim/simulator.h"

namespace commlib {

namespace {

struct Placement {
  int hosts = 1;
  bool shares = false;  // some host holds two ranks or more
};

// Without a cost model, hierarchical all_reduce on 3 hosts or more runs two_shot between the
// owners from this many bytes (resolve_algorithm).
constexpr int64_t kTwoShotInterBytes = 256 << 10;

Placement placement(const std::vector<int>& host_of) {
  Placement p;
  std::set<int> ids;
  for (int h : host_of) {
    if (!ids.insert(h).second) p.shares = true;
  }
  p.hosts = std::max<int>(1, static_cast<int>(ids.size()));
  if (host_of.empty()) p.shares = false;
  return p;
}

// rail_halving and rail_lanes requested by name take the model's segments (and lanes), as auto
// does, unless COMMLIB_HIER_SEGMENT is set (then its segment, as for hierarchical).
bool own_shape(const std::string& algorithm) {
  return (algorithm == "rail_halving" || algorithm == "rail_lanes") && !param_set("COMMLIB_HIER_SEGMENT");
}

Composition model_shape(const CallShape& call, const std::string& algorithm, const sim::Topology& model,
                        const std::vector<int>& host_of) {
  return choose_pipeline_shape(call, Composition{algorithm, "", "", 0}, placed_model(model, host_of));
}

}  // namespace

int64_t hier_segment_setting() { return param_int("COMMLIB_HIER_SEGMENT", 1, INT64_MAX); }

std::vector<AlgorithmChoice> predict_candidates(const CallShape& call, const std::vector<int>& host_of,
                                                const sim::Topology& model) {
  const sim::Topology topo = placed_model(model, host_of);
  const int64_t segment = hier_segment_setting();
  std::vector<AlgorithmChoice> out;
  for (const Composition& k : candidate_list(call.coll, host_of, segment, call.count * call.elem_bytes)) {
    AlgorithmChoice c;
    static_cast<Composition&>(c) = choose_pipeline_shape(call, k, topo);
    c.source = "model";
    c.predicted_s = sim::simulate(call.coll, c, call.count, call.elem_bytes, call.root, topo).time_s;
    out.push_back(c);
  }
  return out;
}

AlgorithmChoice resolve_algorithm(const CallShape& call, const std::string& requested, const std::string& env_value,
                                  int size, const std::vector<int>& host_of, const sim::Topology* model,
                                  std::vector<AlgorithmChoice>* ranked) {
  const Collective c = call.coll;
  check_has_schedules(c);
  const int64_t bytes = call.count * call.elem_bytes;
  const Placement p = placement(host_of);
  AlgorithmChoice choice;
  choice.segment = hier_segment_setting();
  auto best_of = [&](const std::vector<AlgorithmChoice>& cands, bool hier_only) {  // tie_rule.h
    std::vector<double> times;
    for (const AlgorithmChoice& k : cands)
      times.push_back(hier_only && k.algorithm != "hierarchical" ? std::numeric_limits<double>::infinity() : k.predicted_s);
    const size_t pick = tie_pick(times);
    return pick < cands.size() ? cands[pick] : AlgorithmChoice{};
  };
  const bool model_applies = model && p.hosts > 1;
  if (requested != "auto") {
    choice.algorithm = choose_algorithm(c, requested, bytes, size);
    choice.source = "requested";
    if (choice.algorithm == "hierarchical" && model_applies && p.shares) {
      const AlgorithmChoice best = search_best_candidate(call, host_of, *model, true);
      if (!best.algorithm.empty()) static_cast<Composition&>(choice) = best;  // hierarchical, its phases
      choice.predicted_s = best.predicted_s;
    } else if (model_applies && p.shares && own_shape(choice.algorithm)) {
      static_cast<Composition&>(choice) = model_shape(call, choice.algorithm, *model, host_of);
    }
    return choice;
  }
  const int world = size;
  std::string name;
  if (!model_applies) {  // no cost model (or one host): the link-kind rule, then the size policy
    LinkProfile links;
    links.crosses_hosts = p.hosts > 1;
    links.shares_hosts = p.shares;
    choice.algorithm = choose_auto_for_links(c, env_value, bytes, world, links);
    const bool overridden = !env_value.empty() && env_value != "auto";
    choice.source = overridden ? "override" : (links.crosses_hosts && links.shares_hosts) ? "links" : "size";
    // The built-in inter-host exchange sends every block to each of the other H - 1 hosts; from 3
    // hosts a reduce-scatter + all-gather between the owners (two_shot) sends 2(H - 1)/H of it, so
    // it wins by about H/2 once bandwidth dominates. Measured on 2+1+3 ranks at 1 Gbit/s
    // (bench/RESULTS_multihost.md, "auto at 1 Gbit/s"): 1.6-1.9x faster at 1 and 16 MiB; the
    // simulator puts the crossover between 16 and 256 KiB on every preset, hence the bound.
    if (!overridden && choice.algorithm == "hierarchical" && c == Collective::AllReduce && p.hosts >= 3 &&
        bytes >= kTwoShotInterBytes)
      choice.inter = "two_shot";
    return choice;
  }
  if (!env_value.empty() && env_value != "auto") {
    choice.algorithm = choose_auto(c, env_value, bytes, world);
    choice.source = "override";
    return choice;
  }
  if (tuned_algorithm(c, bytes, world, &name, p.hosts)) {
    choice.algorithm = name;
    choice.source = "tuning";
    return choice;
  }
  if (!ranked) return search_best_candidate(call, host_of, *model, false);  // fast, the same answer
  std::vector<AlgorithmChoice> cands = predict_candidates(call, host_of, *model);
  AlgorithmChoice best = best_of(cands, false);
  *ranked = std::move(cands);
  return best;
}

std::string describe_choice(const CallShape& call, int size, const AlgorithmChoice& choice) {
  char buf[256];
  std::string algo = choice.algorithm;
  if (!choice.inter.empty())
    algo += "(inter " + choice.inter + (choice.intra.empty() ? "" : ", intra " + choice.intra) + ")";
  if (choice.predicted_s >= 0)
    std::snprintf(buf, sizeof buf, "auto picked %s for %s of %lld bytes on %d ranks (%s: %.3g us predicted)",
                  algo.c_str(), collective_name(call.coll), static_cast<long long>(call.count * call.elem_bytes), size,
                  choice.source.c_str(), choice.predicted_s * 1e6);
  else
    std::snprintf(buf, sizeof buf, "auto picked %s for %s of %lld bytes on %d ranks (%s)", algo.c_str(),
                  collective_name(call.coll), static_cast<long long>(call.count * call.elem_bytes), size,
                  choice.source.c_str());
  return buf;
}

Composition resolve_on_model(Collective c, const Composition& requested, int64_t count, int elem_bytes, int root,
                             const sim::Topology& model) {
  sim::check_call(c, count, elem_bytes, root, model);  // the simulator's own errors, before auto reads anything
  if (requested.algorithm != "auto") {
    Composition k = requested;
    const std::set<int> hosts(model.host_of.begin(), model.host_of.end());
    if (k.segment < 0 && own_shape(k.algorithm) && hosts.size() > 1 && hosts.size() < model.host_of.size())
      return model_shape(CallShape{c, count, elem_bytes, collective_has_root(c) ? root : 0}, k.algorithm, model,
                         model.host_of);
    if (k.segment < 0) k.segment = hier_segment_setting();
    return k;
  }
  const CallShape call{c, count, elem_bytes, collective_has_root(c) ? root : 0};
  return resolve_algorithm(call, "auto", algorithm_override(c), model.size(), model.host_of, &model);
}

std::shared_ptr<const sim::Topology> share_cost_model(const sim::Topology& model) {
  return std::make_shared<const sim::Topology>(model);
}

}  // namespace commlib
