// The one resolution of a call's algorithm (auto_policy.h, resolve_algorithm): override, measured
// tuning table, then the cost model (the simulator on this communicator's placement), then the
// link-kind rule.
#include <cstdio>
#include <limits>
#include <set>

#include "common/params.h"
#include "policy/auto_policy.h"
#include "schedule/registry.h"
#include "sim/simulator.h"

namespace commlib {

namespace {

struct Placement {
  int hosts = 1;
  bool shares = false;  // some host holds two ranks or more
};

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

// The model's topology on this placement: host ids renumbered densely, NICs by local index.
sim::Topology placed(const sim::Topology& model, const std::vector<int>& host_of) {
  sim::Topology t = model;
  std::vector<int> ids, count;
  t.host_of.assign(host_of.size(), 0);
  t.nic_of.assign(host_of.size(), 0);
  for (size_t r = 0; r < host_of.size(); ++r) {
    size_t h = 0;
    while (h < ids.size() && ids[h] != host_of[r]) ++h;
    if (h == ids.size()) {
      ids.push_back(host_of[r]);
      count.push_back(0);
    }
    t.host_of[r] = static_cast<int>(h);
    t.nic_of[r] = count[h]++ % std::max(1, t.nics_per_host);
  }
  return t;
}

bool is_builtin(const AlgorithmSpec& s) { return !(s.traits & kUserDefined); }

}  // namespace

int64_t hier_segment_setting() { return param_int("COMMLIB_HIER_SEGMENT", 1, INT64_MAX); }

std::vector<AlgorithmChoice> predict_candidates(const CallShape& call, const std::vector<int>& host_of,
                                                const sim::Topology& model) {
  const sim::Topology topo = placed(model, host_of);
  const Placement p = placement(host_of);
  const int64_t segment = hier_segment_setting();
  std::vector<AlgorithmChoice> out;
  std::vector<std::string> flat;
  bool has_hier = false;
  for (const AlgorithmSpec& s : algorithm_specs(call.coll)) {
    if (!is_builtin(s)) continue;
    if (s.name == "hierarchical") has_hier = true;
    else flat.push_back(s.name);
  }
  auto predict = [&](const std::string& algo, const std::string& inter) {
    AlgorithmChoice c;
    c.algorithm = algo;
    c.inter_algorithm = inter;
    c.segment = algo == "hierarchical" ? segment : 0;
    c.source = "model";
    sim::Options o;
    o.inter_algorithm = inter;
    o.segment = c.segment;
    c.predicted_s = sim::simulate(call.coll, algo, call.count, call.elem_bytes, call.root, topo, o).time_s;
    out.push_back(c);
  };
  for (const std::string& f : flat) predict(f, "");
  if (has_hier && p.hosts > 1 && p.shares) {
    predict("hierarchical", "");
    for (const std::string& f : flat) predict("hierarchical", f);
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
  auto best_of = [&](const std::vector<AlgorithmChoice>& cands, bool hier_only) {
    AlgorithmChoice best;
    double t = std::numeric_limits<double>::infinity();
    for (const AlgorithmChoice& k : cands) {
      if (hier_only && k.algorithm != "hierarchical") continue;
      if (k.predicted_s < t) t = k.predicted_s, best = k;
    }
    return best;
  };
  const bool model_applies = model && p.hosts > 1;
  if (requested != "auto") {
    choice.algorithm = choose_algorithm(c, requested, bytes, size);
    choice.source = "requested";
    if (choice.algorithm == "hierarchical" && model_applies && p.shares) {
      const AlgorithmChoice best = best_of(predict_candidates(call, host_of, *model), true);
      choice.inter_algorithm = best.inter_algorithm;
      choice.predicted_s = best.predicted_s;
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
    return choice;
  }
  if (!env_value.empty() && env_value != "auto") {
    choice.algorithm = choose_auto(c, env_value, bytes, world);
    choice.source = "override";
    return choice;
  }
  if (tuned_algorithm(c, bytes, world, &name)) {
    choice.algorithm = name;
    choice.source = "tuning";
    return choice;
  }
  std::vector<AlgorithmChoice> cands = predict_candidates(call, host_of, *model);
  AlgorithmChoice best = best_of(cands, false);
  if (ranked) *ranked = std::move(cands);
  return best;
}

std::string describe_choice(const CallShape& call, int size, const AlgorithmChoice& choice) {
  char buf[256];
  std::string algo = choice.algorithm;
  if (!choice.inter_algorithm.empty()) algo += "(inter " + choice.inter_algorithm + ")";
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

std::shared_ptr<const sim::Topology> share_cost_model(const sim::Topology& model) {
  return std::make_shared<const sim::Topology>(model);
}

}  // namespace commlib
