// The cost model's pipeline shapes (policy/pipeline_shape.h) for Python: _C.pipeline_shape(),
// _C.pipeline_estimate(), _C.simulated_shape_within(), _C.simulated_shapes(). Beside the simulator's bindings
// (sim_bindings.cc), whose topology dicts they take.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <stdexcept>
#include <string>

#include "bindings/bindings.h"
#include "policy/auto_policy.h"
#include "policy/pipeline_shape.h"
#include "sim/simulator.h"
#include "sim/topology.h"

namespace py = pybind11;

namespace commlib {

void bind_shapes(py::module_& m) {
  m.def(
      "pipeline_shape",
      [](Collective c, int64_t count, int elem_bytes, const py::dict& topology, const std::string& inter_algorithm,
         const std::string& intra_algorithm) {
        const sim::Topology t = topology_from_dict(topology);
        sim::check_call(c, count, elem_bytes, 0, t);
        double estimate = -1;
        Composition k;
        {
          py::gil_scoped_release nogil;
          k = choose_pipeline_shape(CallShape{c, count, elem_bytes, 0},
                                    Composition{"hierarchical", inter_algorithm, intra_algorithm, 0}, t, &estimate);
        }
        py::dict out;
        out["segment"] = k.segment;
        out["pieces"] = k.pieces;
        out["estimate_s"] = estimate;
        return out;
      },
      py::arg("collective"), py::arg("count"), py::arg("elem_bytes"), py::arg("topology"),
      py::arg("inter_algorithm") = "", py::arg("intra_algorithm") = "",
      "The segment and pieces the cost model's policy gives hierarchical with these phases on this placed "
      "topology (policy/pipeline_shape.h), with the analytic estimate it chose by: {segment, pieces, "
      "estimate_s} (segment 0: not pipelined).");

  m.def(
      "simulated_shape_within",
      [](Collective c, const std::string& algorithm, int64_t count, int elem_bytes, const py::dict& topology,
         double beat_s) {
        const sim::Topology t = topology_from_dict(topology);
        sim::check_call(c, count, elem_bytes, 0, t);
        const CallShape call{c, count, elem_bytes, 0};
        const Composition cand{algorithm, "", "", 0};
        if (!shape_is_simulated(call, cand, t)) throw std::invalid_argument(algorithm + ": its shape is not simulated");
        Composition k;
        double time_s = -1;
        int runs = 0, cut = 0;
        bool found = false;
        {
          py::gil_scoped_release nogil;
          found = choose_simulated_shape(call, cand, t, beat_s, {}, &k, &time_s, &runs, &cut);
        }
        py::dict out;
        out["found"] = found;
        out["segment"] = found ? k.segment : -1;
        out["pieces"] = found ? k.pieces : -1;
        out["share"] = found ? k.share : -1;  // 1: ramped segments
        out["time_s"] = found ? time_s : -1.0;
        out["runs"] = runs;
        out["cut"] = cut;
        return out;
      },
      py::arg("collective"), py::arg("algorithm"), py::arg("count"), py::arg("elem_bytes"), py::arg("topology"),
      py::arg("beat_s"),
      "The shape the cost model simulates its way to (rail_lanes: policy/pipeline_shape.h, "
      "choose_simulated_shape) when only a time within beat_s matters, as auto's search asks: {found, segment, "
      "pieces, share, time_s, runs, cut} (found False: every shape slower than beat_s).");

  m.def(
      "simulated_shapes",
      [](Collective c, const std::string& algorithm, int64_t count, int elem_bytes, const py::dict& topology) {
        const sim::Topology t = topology_from_dict(topology);
        sim::check_call(c, count, elem_bytes, 0, t);
        const CallShape call{c, count, elem_bytes, 0};
        const Composition cand{algorithm, "", "", 0};
        if (!shape_is_simulated(call, cand, t)) throw std::invalid_argument(algorithm + ": its shape is not simulated");
        py::list out;
        for (const Composition& k : simulated_shapes(call, cand, t)) {
          py::dict d;
          d["segment"] = k.segment;
          d["pieces"] = k.pieces;
          d["share"] = k.share;
          d["intra_algorithm"] = k.intra;
          out.append(d);
        }
        return out;
      },
      py::arg("collective"), py::arg("algorithm"), py::arg("count"), py::arg("elem_bytes"), py::arg("topology"),
      "The shapes choose_simulated_shape plays for this call (policy/pipeline_shape.h, simulated_shapes), in "
      "its order, without playing them: [{segment, pieces, share, intra_algorithm}] (pieces: lanes; share 1: ramped "
      "segments).");

  m.def(
      "pipeline_estimate",
      [](Collective c, const std::string& algorithm, int64_t count, int elem_bytes, const py::dict& topology,
         const std::string& inter_algorithm, int64_t segment, const std::string& intra_algorithm, int pieces,
         int share) {
        const sim::Topology t = topology_from_dict(topology);
        sim::check_call(c, count, elem_bytes, 0, t);
        if (segment < 0 || pieces < 0 || share < 0) throw std::invalid_argument("segment, pieces, share: must be >= 0");
        py::gil_scoped_release nogil;
        return pipeline_estimate(CallShape{c, count, elem_bytes, 0},
                                 Composition{algorithm, inter_algorithm, intra_algorithm, segment, pieces, share}, t);
      },
      py::arg("collective"), py::arg("algorithm"), py::arg("count"), py::arg("elem_bytes"), py::arg("topology"),
      py::arg("inter_algorithm") = "", py::arg("segment") = 0, py::arg("intra_algorithm") = "", py::arg("pieces") = 0,
      py::arg("share") = 0,
      "The analytic estimate (seconds) pipeline_shape chooses by (policy/pipeline_shape.h), of any composition.");

}

}  // namespace commlib
