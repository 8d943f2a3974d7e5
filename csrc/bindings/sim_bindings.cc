// Python binding of the simulator engine: _C.simulate(collective, algorithm, count, elem_bytes,
// root, topology) with the topology as a dict of sim::Topology's fields (commlib/sim builds it).
#include <pybind11/stl.h>

#include <algorithm>
#include <memory>
#include <set>
#include <utility>

#include "bindings/bindings.h"
#include "common/params.h"
#include "kernels/cpu_codecs.h"
#include "policy/auto_policy.h"
#include "policy/candidate_search.h"
#include "policy/tie_rule.h"
#include "sim/compact.h"
#include "sim/simulator.h"

namespace py = pybind11;

namespace commlib {

namespace {

enum DictField { Need, Opt };

// d[k] into `field` (std::invalid_argument naming topology.<at><k> when missing or of the wrong type;
// an Opt field absent keeps its default).
template <typename T>
void read_field(const py::dict& d, const std::string& at, const char* k, DictField need, T& field) {
  if (!d.contains(k)) {
    if (need == Opt) return;
    throw std::invalid_argument("topology." + at + k + ": missing");
  }
  try {
    field = d[k].cast<T>();
  } catch (const py::cast_error&) {
    throw std::invalid_argument("topology." + at + k + ": wrong type");
  }
}

}  // namespace

sim::Topology topology_from_dict(const py::dict& d) {
#define COMMLIB_SIM_FIELD_NAME(type, name, init, dict, check) #name,
  static const std::set<std::string> known = {COMMLIB_SIM_TOPOLOGY_FIELDS(COMMLIB_SIM_FIELD_NAME) "memory_tiers"};
  for (auto item : d) {
    const std::string k = py::str(item.first);
    if (!known.count(k)) throw std::invalid_argument("topology." + k + ": unknown field");
  }
  sim::Topology t;
#define COMMLIB_SIM_READ_FIELD(type, name, init, dict, check) read_field(d, "", #name, dict, t.name);
  COMMLIB_SIM_TOPOLOGY_FIELDS(COMMLIB_SIM_READ_FIELD)
#undef COMMLIB_SIM_READ_FIELD
  // Memory tiers are optional: without them one tier (the rates above) serves every size.
  if (d.contains("memory_tiers")) {
    py::list tiers;
    try {
      tiers = d["memory_tiers"].cast<py::list>();
    } catch (const py::cast_error&) {
      throw std::invalid_argument("topology.memory_tiers: wrong type (a list of dicts)");
    }
    for (size_t i = 0; i < tiers.size(); ++i) {
      const std::string at = "memory_tiers[" + std::to_string(i) + "].";
      py::dict m;
      try {
        m = tiers[i].cast<py::dict>();
      } catch (const py::cast_error&) {
        throw std::invalid_argument("topology." + at.substr(0, at.size() - 1) + ": wrong type (a dict)");
      }
      sim::Topology::MemoryTier tier;
#define COMMLIB_SIM_READ_TIER(type, name, init, dict, check) read_field(m, at, #name, dict, tier.name);
      COMMLIB_SIM_MEMORY_TIER_FIELDS(COMMLIB_SIM_READ_TIER)
#undef COMMLIB_SIM_READ_TIER
      static const size_t tier_fields = std::set<std::string>{COMMLIB_SIM_MEMORY_TIER_FIELDS(COMMLIB_SIM_FIELD_NAME)}.size();
      if (m.size() != tier_fields) throw std::invalid_argument("topology." + at.substr(0, at.size() - 1) + ": unknown field");
      t.memory_tiers.push_back(tier);
    }
  }
  return t;
}

py::list topology_fields() {
  py::list out;
#define COMMLIB_SIM_FIELD_ROW(type, name, init, dict, check) out.append(py::make_tuple(#name, dict == Need));
  COMMLIB_SIM_TOPOLOGY_FIELDS(COMMLIB_SIM_FIELD_ROW)
  out.append(py::make_tuple("memory_tiers", false));
  return out;
}

py::list memory_tier_fields() {
  py::list out;
  COMMLIB_SIM_MEMORY_TIER_FIELDS(COMMLIB_SIM_FIELD_ROW)
  return out;
#undef COMMLIB_SIM_FIELD_ROW
#undef COMMLIB_SIM_FIELD_NAME
}

namespace {

py::dict choice_to_py(const AlgorithmChoice& c) {
  py::dict d;
  d["algorithm"] = c.algorithm;
  d["inter_algorithm"] = c.inter;
  d["intra_algorithm"] = c.intra;
  d["segment"] = c.segment;
  d["pieces"] = c.pieces;
  d["share"] = c.share;
  d["predicted_s"] = c.predicted_s;
  d["source"] = c.source;
  return d;
}

// What the simulator's callers do: "auto" resolved by the policy (resolve_on_model, the cost model
// being a leaf under it), then the concrete composition played, without the GIL.
std::pair<Composition, sim::Result> play(Collective c, const Composition& requested, int64_t count, int elem_bytes,
                                         int root, const sim::Topology& t, sim::Trace* trace,
                                         const sim::CodecCost& codec = {}) {
  py::gil_scoped_release nogil;
  const Composition how = resolve_on_model(c, requested, count, elem_bytes, root, t);
  sim::Options o;
  o.trace = trace;
  o.codec = codec;
  return {how, sim::simulate(c, how, count, elem_bytes, root, t, o)};
}

}  // namespace

void bind_sim(py::module_& m) {
  m.def(
      "simulate",
      [](Collective c, const std::string& algorithm, int64_t count, int elem_bytes, int root,
         const py::dict& topology, const std::string& inter_algorithm, int64_t segment,
         const std::string& intra_algorithm, const std::string& codec, int64_t block, bool inter_only,
         double encode_ns, double decode_ns, int64_t piece_bytes, int pieces, double feedback_ns, int share) {
        if (pieces < 0) throw std::invalid_argument("pieces: must be >= 0, got " + std::to_string(pieces));
        if (share < 0) throw std::invalid_argument("share: must be >= 0, got " + std::to_string(share));
        sim::CodecCost cost;
        if (!codec.empty()) {
          CodecSpec spec;
          spec.kind = codec_kind(codec);
          spec.block = block;
          check_codec(spec, DType::Float32);
          // The codec's layout, as kernels/cpu_codecs.cc lays it out (tests/sim checks the bytes
          // against Codec.encoded_size): a scale byte per block but bf16's; 16, 4 or 8 bits a code.
          const bool bf16 = spec.kind == kern::CodecKind::BF16;
          // Pieces as host/compressed_lowering.cc cuts them: whole blocks of the input's bytes.
          if (piece_bytes < 0) piece_bytes = static_cast<int64_t>(param_bytes("COMMLIB_COMPRESS_PIECE_BYTES"));
          const int64_t unit = bf16 ? 1 : block;
          const int64_t piece = piece_bytes > 0 ? std::max<int64_t>(1, piece_bytes / elem_bytes / unit) * unit : 0;
          // Default rates: CPU ns per float32 element of kernels/cpu_codecs.cc's loops under nearest
          // rounding, measured (sim/codec_cost.cc says where; docs/compression.md "Cost").
          const sim::CodecRates rates = sim::default_codec_rates(codec_name(spec.kind));
          if (encode_ns < 0) encode_ns = rates.encode_ns;
          if (decode_ns < 0) decode_ns = rates.decode_ns;
          cost = sim::codec_cost(block, bf16 ? 0 : 1, bf16 ? 16 : spec.kind == kern::CodecKind::Int4 ? 4 : 8,
                                 inter_only, encode_ns, decode_ns, piece);
          // Error feedback: one pass over the rank's input (reduce_scatter's: every rank's block)
          // before the collective; -1: its measured rate (sim/codec_cost.cc).
          if (feedback_ns < 0) feedback_ns = sim::default_feedback_ns();
          if (!(feedback_ns < 1e6)) throw std::invalid_argument("feedback_ns: ns per element in [0, 1e6)");
          const int64_t input = c == Collective::ReduceScatter ? count * topology_from_dict(topology).size() : count;
          cost.prelude_s = feedback_ns * 1e-9 * static_cast<double>(input);
        }
        const auto [how, r] = play(c, Composition{algorithm, inter_algorithm, intra_algorithm, segment, pieces, share}, count,
                                   elem_bytes, root, topology_from_dict(topology), nullptr, cost);
        py::dict out;
        out["time_s"] = r.time_s;
        out["build_s"] = r.build_s;
        out["built_cached"] = r.built_cached;
        out["run_s"] = r.run_s;
        out["steps"] = r.steps;
        out["transfers"] = r.transfers;
        out["bytes_inter"] = r.bytes_inter;
        out["bytes_intra"] = r.bytes_intra;
        out["shapes"] = r.shapes;
        out["nic_busy_s"] = r.nic_busy_s;
        out["port_busy_s"] = r.port_busy_s;
        out["cpu_busy_s"] = r.cpu_busy_s;
        out["ranks_beyond_cache"] = r.ranks_beyond_cache;
        out["max_working_set_bytes"] = r.max_working_set_bytes;
        out["algorithm"] = how.algorithm;
        out["inter_algorithm"] = how.inter;
        out["intra_algorithm"] = how.intra;
        out["segment"] = how.segment;
        out["pieces"] = how.pieces;
        out["share"] = how.share;
        return out;
      },
      py::arg("collective"), py::arg("algorithm"), py::arg("count"), py::arg("elem_bytes"), py::arg("root"),
      py::arg("topology"), py::arg("inter_algorithm") = "", py::arg("segment") = -1, py::arg("intra_algorithm") = "",
      py::arg("codec") = "", py::arg("block") = 32, py::arg("inter_only") = false, py::arg("encode_ns") = -1.0,
      py::arg("decode_ns") = -1.0, py::arg("piece_bytes") = -1, py::arg("pieces") = 0,
      py::arg("feedback_ns") = 0.0, py::arg("share") = 0,
      "Predicted time of one collective: plays every rank's schedule on the topology (sim/simulator.h). "
      "codec/block/inter_only: compress= (sim/codec_cost.h; encode_ns/decode_ns per element, -1: the default; "
      "piece_bytes: streamed pieces of input, -1: COMMLIB_COMPRESS_PIECE_BYTES, 0: whole messages; feedback_ns: "
      "error feedback's pass per input element before the collective, 0: none, -1: its measured rate). "
      "inter_algorithm/segment/intra_algorithm: hierarchical's inter-host algorithm (\"\": built-in exchange), "
      "pipeline segment (-1: COMMLIB_HIER_SEGMENT) and intra-host algorithm (\"\": built-in exchanges); "
      "pieces: the overlapped pipeline's most pieces per lane segment (0: the builder's cap); "
      "share: rail_split's rail rings' share of the buffer in 1/1024 (0: the builder's default).");

  m.def("clear_built_programs", &sim::clear_built_programs,
        "Empties the simulator's cache of built schedules (sim/compact.h, built_programs).");

  m.def(
      "simulate_trace",
      [](Collective c, const std::string& algorithm, int64_t count, int elem_bytes, int root,
         const py::dict& topology, const std::string& inter_algorithm, int64_t segment,
         const std::string& intra_algorithm, int pieces, int share) {
        if (pieces < 0) throw std::invalid_argument("pieces: must be >= 0, got " + std::to_string(pieces));
        if (share < 0) throw std::invalid_argument("share: must be >= 0, got " + std::to_string(share));
        const sim::Topology t = topology_from_dict(topology);
        if (t.size() > 64) throw std::invalid_argument("topology: the trace explains up to 64 ranks");
        sim::Trace trace;
        const auto [how, r] = play(c, Composition{algorithm, inter_algorithm, intra_algorithm, segment, pieces, share},
                                   count, elem_bytes, root, t, &trace);
        py::list transfers;
        for (const auto& x : trace.transfers)
          transfers.append(py::make_tuple(x.src, x.dst, x.src_step, x.dst_step, x.bytes, x.start, x.done, x.links));
        py::dict out;
        out["time_s"] = r.time_s;
        out["algorithm"] = how.algorithm;
        out["segment"] = how.segment;
        out["pieces"] = how.pieces;
        out["share"] = how.share;
        out["steps"] = trace.steps;
        out["transfers"] = std::move(transfers);
        out["links"] = trace.link_names;
        return out;
      },
      py::arg("collective"), py::arg("algorithm"), py::arg("count"), py::arg("elem_bytes"), py::arg("root"),
      py::arg("topology"), py::arg("inter_algorithm") = "", py::arg("segment") = -1, py::arg("intra_algorithm") = "",
      py::arg("pieces") = 0, py::arg("share") = 0,
      "simulate() on up to 64 ranks (pieces, share: as simulate()'s), with what happened: {time_s, algorithm, "
      "segment, pieces, share (as played), steps: [rank][step] -> (entered_s, "
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
  m.def("sim_topology_fields", &topology_fields,
        "The simulator topology's fields as [(name, required)] (sim/topology.h's one list; commlib/sim's "
        "makers write these names).");
  m.def("sim_memory_tier_fields", &memory_tier_fields,
        "A memory tier's fields as [(name, required)] (sim/topology.h).");
  m.def("clear_candidate_cache", &clear_candidate_cache, "Drops auto's cache of cost-model choices (tests).");
  // auto's tie rule (policy/tie_rule.h): predictions within this relative distance are a tie, which
  // goes to the candidate listed first (tests and benches that pick from predict_candidates use it).
  m.attr("AUTO_TIE_RELATIVE") = kTieRelative;
  m.def(
      "candidate_lower_bound",
      [](Collective collective, const std::string& algorithm, int64_t count, int elem_bytes, int root,
         const py::dict& topology, const std::string& inter_algorithm, int64_t segment,
         const std::string& intra_algorithm) {
        const sim::Topology t = topology_from_dict(topology);
        return candidate_lower_bound(
            CallShape{collective, count, elem_bytes, root},
            Composition{algorithm, inter_algorithm, intra_algorithm, segment < 0 ? hier_segment_setting() : segment}, t);
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
