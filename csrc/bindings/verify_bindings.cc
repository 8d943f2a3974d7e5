// The verifier's bindings (verify/verifier.h): verify(), verify_trace(), _verify_custom(). The
// VerificationError they raise is registered with the schedule bindings (bind_schedule, first).
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <algorithm>
#include <string>
#include <utility>
#include <vector>

#include "bindings/bindings.h"
#include "policy/auto_policy.h"
#include "schedule/registry.h"
#include "verify/verifier.h"
#include "verify/verifier_lanes.h"

namespace py = pybind11;

namespace commlib {
namespace {

// trace_schedules' holdings as [rank][k] -> [input, output, scratch], each None (not owned) or
// [[start, len, src, [contributing ranks]], ...].
py::list holdings_to_py(const Holdings& h) {
  py::list out;
  for (const auto& per_rank : h) {
    py::list steps;
    for (const auto& bufs : per_rank) {
      py::list b3;
      for (const HeldBuffer& b : bufs) {
        if (b.size < 0) {
          b3.append(py::none());
          continue;
        }
        py::list runs;
        for (const HeldRun& r : b.runs) runs.append(py::make_tuple(r.start, r.len, r.src, r.ranks));
        b3.append(std::move(runs));
      }
      steps.append(std::move(b3));
    }
    out.append(std::move(steps));
  }
  return out;
}

}  // namespace

void bind_verify(py::module_& m) {
  m.def(
      "verify",
      [](Collective collective, const std::string& algorithm, int size, int64_t count, int root, DType dtype) {
        py::gil_scoped_release nogil;  // a Python-registered builder takes it back while it runs
        return verify_algorithm(collective, algorithm, size, count, root, dtype);
      },
      py::arg("collective"), py::arg("algorithm"), py::arg("size"), py::arg("count"), py::arg("root") = 0,
      py::arg("dtype") = DType::Float32,
      "Symbolically run every rank's schedule (both buffer layouts); raise VerificationError on a bug. "
      "Returns the algorithm verified (\"auto\" resolves for count elements of dtype).");

  m.def(
      "verify_trace",
      [](Collective collective, const std::string& algorithm, int size, int64_t count, int root, DType dtype,
         std::vector<int> hosts, const std::string& inter, int64_t segment, const std::string& intra) {
        if (size < 1) throw std::invalid_argument("size: must be >= 1, got " + std::to_string(size));
        if (count < 0) throw std::invalid_argument("count: must be >= 0, got " + std::to_string(count));
        const int64_t bytes = count * static_cast<int64_t>(dtype_size(dtype));
        const std::string name = choose_algorithm(collective, algorithm, bytes, size);
        CollArgs a;
        a.coll = collective;
        a.size = size;
        a.count = count;
        a.root = collective_has_root(collective) ? root : 0;
        a.host_of = std::move(hosts);
        a.compose(Composition{name, inter, intra, segment < 0 ? hier_segment_setting() : segment});
        Holdings h;
        {
          py::gil_scoped_release nogil;  // a Python-registered builder takes it back while it runs
          std::vector<Schedule> per_rank(size);
          for (int r = 0; r < size; ++r) {
            a.rank = r;
            per_rank[r] = build_schedule(a, name);
          }
          h = trace_schedules(collective, per_rank, size, count, a.root, name);
        }
        py::dict out;
        out["algorithm"] = name;
        out["holdings"] = holdings_to_py(h);
        return out;
      },
      py::arg("collective"), py::arg("algorithm"), py::arg("size"), py::arg("count"), py::arg("root") = 0,
      py::arg("dtype") = DType::Float32, py::arg("hosts") = std::vector<int>{}, py::arg("inter") = "",
      py::arg("segment") = -1, py::arg("intra") = "",
      "Verify the algorithm (out-of-place layout, as verify()) and return {algorithm, holdings}: "
      "holdings[rank][k] is what the rank's [input, output, scratch] buffers hold before its first step "
      "(k = 0) and after its step k - 1: None (not owned) or runs (start, len, src, ranks): elements "
      "[start, start + len) hold source elements src, src + 1, ... reduced from the inputs of `ranks` "
      "(src < 0: uninitialised). Up to 64 ranks; other arguments as schedule().");

  m.def(
      "_verify_custom",
      [](Collective c, int size, int64_t count, py::sequence schedules, int root, py::object in_place, py::object lanes_arg) {
        std::vector<Schedule> per_rank;
        bool given = false;  // whether the schedules name each step's lane (step_lanes)
        for (py::handle h : schedules) {
          per_rank.push_back(schedule_from_py(h));
          given = given || (py::isinstance<py::dict>(h) && h.cast<py::dict>().contains("step_lanes"));
        }
        std::vector<bool> modes;
        if (in_place.is_none()) {
          modes.push_back(false);
          if (collective_has_in_place(c)) modes.push_back(true);
        } else {
          modes.push_back(in_place.cast<bool>());
        }
        int lanes = 1;  // given, else one more than the highest step lane
        if (!lanes_arg.is_none()) lanes = lanes_arg.cast<int>();
        else
          for (const Schedule& s : per_rank)
            for (const Step& st : s.steps) lanes = std::max(lanes, st.lane + 1);
        py::gil_scoped_release nogil;
        if (!given && lanes > 1) assign_contiguous_lanes(per_rank, lanes, "custom");
        if (static_cast<int>(per_rank.size()) == size) check_lanes(c, per_rank, size, count, root, lanes, "custom");
        for (bool ip : modes) verify_schedules(c, per_rank, size, count, root, ip, "custom");
      },
      py::arg("collective"), py::arg("size"), py::arg("count"), py::arg("schedules"), py::arg("root") = 0,
      py::arg("in_place") = py::none(), py::arg("lanes") = py::none(),
      "Verify user-given per-rank schedules (same format as schedule(); a plain list of steps is also "
      "accepted, with scratch_count inferred). `lanes`: the schedules' lane count (None: one more than the highest "
      "step lane); each step's lane is its "
      "schedule's step_lanes entry, or without step_lanes lane c is the c-th lanes-th of a rank's steps "
      "(schedule/lanes.h); the lanes and windows are proven independent first (verify/verifier_lanes.h).");
}

}  // namespace commlib
