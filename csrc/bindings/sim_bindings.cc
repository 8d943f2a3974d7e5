// Python binding of the simulator engine: _C.simulate(collective, algorithm, count, elem_bytes,
// root, topology) with the topology as a dict of sim::Topology's fields (commlib/sim builds it).
#include <pybind11/stl.h>

#include <memory>
#include <set>

#include "bindings/bindings.h"
#include "policy/auto_policy.h"
#include "policy/candidate_search.h"
#include "sim/simulator.h"

namespace py = pybind11;

namespace commlib {

sim::Topology topology_from_dict(const py::dict& d) {
  static const std::set<std::string> known = {
      "host_of", "nic_of", "nics_per_host", "intra_latency_s", "intra_port_Bps", "intra_bus_Bps",
      "inter_latency_s", "nic_Bps", "reduce_s_per_byte", "copy_s_per_byte", "op_overhead_s",
      "step_overhead_s", "chunk_bytes", "memory_tiers", "cores_per_host", "sched_quantum_s", "spin_s", "wake_s", "inter_spin_s",
      "send_overhead_s", "recv_overhead_s", "nic_gap_s", "nic_burst_bytes"};
  for (auto item : d) {
    const std::string k = py::str(item.first);
    if (!known.count(k)) throw std::invalid_argument("topology." + k + ": unknown field");
  }
  sim::Topology t;
  auto get = [&](const char* k, auto& field) {
    if (!d.contains(k)) throw std::invalid_argument(std::string("topology.") + k + ": missing");
    try {
      field = d[k].cast<std::decay_t<decltype(field)>>();
    } catch (const py::cast_error&) {
      throw std::invalid_argument(std::string("topology.") + k + ": wrong type");
    }
  };
  get("host_of", t.host_of);
  get("nic_of", t.nic_of);
  get("nics_per_host", t.nics_per_host);
  get("intra_latency_s", t.intra_latency_s);
  get("intra_port_Bps", t.intra_port_Bps);
  get("intra_bus_Bps", t.intra_bus_Bps);
  get("inter_latency_s", t.inter_latency_s);
  get("nic_Bps", t.nic_Bps);
  get("reduce_s_per_byte", t.reduce_s_per_byte);
  get("copy_s_per_byte", t.copy_s_per_byte);
  get("op_overhead_s", t.op_overhead_s);
  get("step_overhead_s", t.step_overhead_s);
  get("chunk_bytes", t.chunk_bytes);
  // CPU scheduling is optional: without it every rank has a core and never sleeps.
  if (d.contains("cores_per_host")) get("cores_per_host", t.cores_per_host);
  if (d.contains("sched_quantum_s")) get("sched_quantum_s", t.sched_quantum_s);
  if (d.contains("spin_s")) get("spin_s", t.spin_s);
  if (d.contains("wake_s")) get("wake_s", t.wake_s);
  if (d.contains("inter_spin_s")) get("inter_spin_s", t.inter_spin_s);
  // Per-message costs are optional (LogGP's o and g; 0: none).
  if (d.contains("send_overhead_s")) get("send_overhead_s", t.send_overhead_s);
  if (d.contains("recv_overhead_s")) get("recv_overhead_s", t.recv_overhead_s);
  if (d.contains("nic_gap_s")) get("nic_gap_s", t.nic_gap_s);
  if (d.contains("nic_burst_bytes")) get("nic_burst_bytes", t.nic_burst_bytes);
  // Memory tiers are optional: without them one tier (the rates above) serves every size.
  if (d.contains("memory_tiers")) {
    py::list tiers;
    try {
      tiers = d["memory_tiers"].cast<py::list>();
    } catch (const py::cast_error&) {
      throw std::invalid_argument("topology.memory_tiers: wrong type (a list of dicts)");
    }
    for (size_t i = 0; i < tiers.size(); ++i) {
      const std::string at = "topology.memory_tiers[" + std::to_string(i) + "].";
      py::dict m;
      try {
        m = tiers[i].cast<py::dict>();
      } catch (const py::cast_error&) {
        throw std::invalid_argument(at.substr(0, at.size() - 1) + ": wrong type (a dict)");
      }
      sim::Topology::MemoryTier tier;
      auto field = [&](const char* k, auto& v) {
        if (!m.contains(k)) throw std::invalid_argument(at + k + ": missing");
        try {
          v = m[k].cast<std::decay_t<decltype(v)>>();
        } catch (const py::cast_error&) {
          throw std::invalid_argument(at + k + ": wrong type");
        }
      };
      field("above_bytes", tier.above_bytes);
      field("port_Bps", tier.port_Bps);
      field("reduce_s_per_byte", tier.reduce_s_per_byte);
      field("copy_s_per_byte", tier.copy_s_per_byte);
      if (m.size() != 4) throw std::invalid_argument(at.substr(0, at.size() - 1) + ": unknown field");
      t.memory_tiers.push_back(tier);
    }
  }
  return t;
}

namespace {

py::dict choice_to_py(const AlgorithmChoice& c) {
  py::dict d;
  d["algorithm"] = c.algorithm;
  d["inter_algorithm"] = c.inter_algorithm;
  d["intra_algorithm"] = c.intra_algorithm;
  d["segment"] = c.segment;
  d["predicted_s"] = c.predicted_s;
  d["source"] = c.source;
  return d;
}

}  // namespace

void bind_sim(py::module_& m) {
  m.def(
      "simulate",
      [](Collective c, const std::string& algorithm, int64_t count, int elem_bytes, int root,
         const py::dict& topology, const std::string& inter_algorithm, int64_t segment,
         const std::string& intra_algorithm, const std::string& codec, int64_t block, bool inter_only,
         double encode_ns, double decode_ns) {
        const sim::Topology t = topology_from_dict(topology);
        sim::Options o{inter_algorithm, segment, intra_algorithm};
        if (!codec.empty()) {
          CodecSpec spec;
          spec.kind = codec_kind(codec);
          spec.block = block;
          spec.inter_only = inter_only;
          check_codec(spec, DType::Float32);
          o.codec = sim::codec_cost(spec, encode_ns, decode_ns);
        }
        sim::Result r;
        {
          py::gil_scoped_release nogil;
          r = sim::simulate(c, algorithm, count, elem_bytes, root, t, o);
        }

        py::dict out;
        out["time_s"] = r.time_s;
        out["build_s"] = r.build_s;
        out["run_s"] = r.run_s;
        out["steps"] = r.steps;
        out["transfers"] = r.transfers;
        out["bytes_inter"] = r.bytes_inter;
        out["bytes_intra"] = r.bytes_intra;
        out["shapes"] = r.shapes;
        out["ranks_beyond_cache"] = r.ranks_beyond_cache;
        out["max_working_set_bytes"] = r.max_working_set_bytes;
        out["algorithm"] = r.algorithm;
        out["inter_algorithm"] = r.inter_algorithm;
        out["intra_algorithm"] = r.intra_algorithm;
        return out;
      },
      py::arg("collective"), py::arg("algorithm"), py::arg("count"), py::arg("elem_bytes"), py::arg("root"),
      py::arg("topology"), py::arg("inter_algorithm") = "", py::arg("segment") = -1, py::arg("intra_algorithm") = "",
      py::arg("codec") = "", py::arg("block") = 32, py::arg("inter_only") = false, py::arg("encode_ns") = -1.0,
      py::arg("decode_ns") = -1.0,
      "Predicted time of one collective: plays every rank's schedule on the topology (sim/simulator.h). "
      "codec/block/inter_only: compress= (sim/codec_cost.h; encode_ns/decode_ns per element, -1: the default). "
      "inter_algorithm/segment/intra_algorithm: hierarchical's inter-host algorithm (\"\": built-in exchange), "
      "pipeline segment (-1: COMMLIB_HIER_SEGMENT) and intra-host algorithm (\"\": built-in exchanges).");

  m.def(
      "simulate_trace",
      [](Collective c, const std::string& algorithm, int64_t count, int elem_bytes, int root,
         const py::dict& topology, const std::string& inter_algorithm, int64_t segment,
         const std::string& intra_algorithm) {
        const sim::Topology t = topology_from_dict(topology);
        if (t.size() > 64) throw std::invalid_argument("topology: the trace explains up to 64 ranks");
        sim::Trace trace;
        sim::Result r;
        {
          py::gil_scoped_release nogil;
          sim::Options o{inter_algorithm, segment, intra_algorithm};
          o.trace = &trace;
          r = sim::simulate(c, algorithm, count, elem_bytes, root, t, o);
        }
        py::list transfers;
        for (const auto& x : trace.transfers)
          transfers.append(py::make_tuple(x.src, x.dst, x.src_step, x.dst_step, x.bytes, x.start, x.done, x.links));
        py::dict out;
        out["time_s"] = r.time_s;
        out["algorithm"] = r.algorithm;
        out["steps"] = trace.steps;
        out["transfers"] = std::move(transfers);
        out["links"] = trace.link_names;
        return out;
      },
      py::arg("collective"), py::arg("algorithm"), py::arg("count"), py::arg("elem_bytes"), py::arg("root"),
      py::arg("topology"), py::arg("inter_algorithm") = "", py::arg("segment") = -1, py::arg("intra_algorithm") = "",
      "simulate() on up to 64 ranks, with what happened: {time_s, algorithm, steps: [rank][step] -> (entered_s, "
      "finished_s), transfers: [(src, dst, src_step, dst_step, bytes, start_s, done_s, [link ids])], links: "
      "[link names by id]} (the schedule explorer's timeline).");

  m.def(
      "search_candidates",
      [](Collective c, int64_t count, int elem_bytes, int root, const py::dict& topology,
         bool hier_only, int64_t extrapolate_ops, int64_t costly_ops) {
        const sim::Topology t = topology_from_dict(topology);
        AlgorithmChoice k;
        SearchStats st;
        {
          py::gil_scoped_release nogil;
          k = search_best_candidate(CallShape{c, count, elem_bytes, root}, t.host_of, t, hier_only, &st,
                                    extrapolate_ops < 0 ? kExtrapolateOps : extrapolate_ops,
                                    costly_ops < 0 ? kCostlyOps : costly_ops);
        }
        py::dict out = choice_to_py(k);
        out["candidates"] = st.candidates;
        out["simulated"] = st.simulated;
        out["cut"] = st.cut;
        out["extrapolated"] = st.extrapolated;
        out["confirmed"] = st.confirmed;
        out["cached"] = st.cached;
        return out;
      },
      py::arg("collective"), py::arg("count"), py::arg("elem_bytes"), py::arg("root"), py::arg("topology"),
      py::arg("hier_only") = false, py::arg("extrapolate_ops") = -1, py::arg("costly_ops") = -1,
      "auto's branch-and-bound search (policy/candidate_search.h): the fastest candidate, and how many "
      "candidates it simulated, cut short, estimated from their first segments (extrapolated; of those "
      "simulated whole: confirmed), or found in the process-wide cache. extrapolate_ops: the size from "
      "which pipelined candidates are estimated first (-1: the library's; 0: never, the exact search). "
      "costly_ops: the size from which candidates are simulated after the cheaper ones (-1: the library's; "
      "0: bound order alone).");
  m.def("clear_candidate_cache", &clear_candidate_cache, "Drops auto's cache of cost-model choices (tests).");
  m.def(
      "candidate_lower_bound",
      [](Collective collective, const std::string& algorithm, int64_t count, int elem_bytes, int root,
         const py::dict& topology, const std::string& inter_algorithm, int64_t segment,
         const std::string& intra_algorithm) {
        const sim::Topology t = topology_from_dict(topology);
        return candidate_lower_bound(CallShape{collective, count, elem_bytes, root},
                                     Candidate{algorithm, inter_algorithm, intra_algorithm},
                                     segment < 0 ? hier_segment_setting() : segment, t);
      },
      py::arg("collective"), py::arg("algorithm"), py::arg("count"), py::arg("elem_bytes"), py::arg("root"),
      py::arg("topology"), py::arg("inter_algorithm") = "", py::arg("segment") = -1, py::arg("intra_algorithm") = "",
      "The search's lower bound on a candidate's predicted time (seconds).");

  m.def(
      "predict_candidates",
      [](Collective c, int64_t count, int elem_bytes, int root, const py::dict& topology) {
        const sim::Topology t = topology_from_dict(topology);
        std::vector<AlgorithmChoice> cands;
        {
          py::gil_scoped_release nogil;
          cands = predict_candidates(CallShape{c, count, elem_bytes, root}, t.host_of, t);
        }
        py::list out;
        for (const auto& k : cands) out.append(choice_to_py(k));
        return out;
      },
      py::arg("collective"), py::arg("count"), py::arg("elem_bytes"), py::arg("root"), py::arg("topology"),
      "Every candidate auto's cost model ranks on this topology, with its predicted time (policy/auto_policy.h).");

  m.def(
      "resolve_algorithm",
      [](Collective c, const std::string& algorithm, int64_t count, int elem_bytes, int root,
         int size, std::vector<int> hosts, py::object topology) {
        std::unique_ptr<sim::Topology> model;
        if (!topology.is_none()) model = std::make_unique<sim::Topology>(topology_from_dict(topology.cast<py::dict>()));
        AlgorithmChoice k;
        std::vector<AlgorithmChoice> ranked;
        {
          py::gil_scoped_release nogil;
          k = resolve_algorithm(CallShape{c, count, elem_bytes, root}, algorithm, algorithm_override(c), size, hosts,
                                model.get(), &ranked);
        }
        py::dict out = choice_to_py(k);
        py::list cands;
        for (const auto& r : ranked) cands.append(choice_to_py(r));
        out["candidates"] = cands;
        return out;
      },
      py::arg("collective"), py::arg("algorithm"), py::arg("count"), py::arg("elem_bytes"), py::arg("root"),
      py::arg("size"), py::arg("hosts"), py::arg("topology") = py::none(),
      "The engine's one resolution of a call's algorithm (policy/auto_policy.h): a dict with algorithm, "
      "inter_algorithm, segment, predicted_s, source, and the candidates the cost model ranked (empty when it "
      "did not decide).");
}

}  // namespace commlib
