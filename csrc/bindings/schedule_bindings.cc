// Python bindings of the schedule layer: algorithms(), schedule(), verify(), choose_algorithm(),
// set_tuning()/clear_tuning(), _verify_custom() and the VerificationError exception.
#include <pybind11/stl.h>

#include "bindings/bindings.h"
#include "engine/verifier.h"
#include "schedule/registry.h"

namespace py = pybind11;

namespace commlib {

namespace {

py::object region_to_py(const Region& g) { return py::make_tuple(buffer_name(g.buf), g.offset, g.count); }

py::dict schedule_to_py(const Schedule& s, const std::string& algorithm) {
  py::list steps;
  for (const Step& st : s.steps) {
    py::list ops;
    for (const Op& o : st.ops) {
      py::dict d;
      d["op"] = op_kind_name(o.kind);
      const bool comm = o.kind == OpKind::Send || o.kind == OpKind::Recv || o.kind == OpKind::RecvReduce;
      d["peer"] = comm ? py::object(py::int_(o.peer)) : py::object(py::none());
      d["dst"] = o.kind != OpKind::Send ? region_to_py(o.dst) : py::object(py::none());
      d["src"] = (o.kind == OpKind::Send || o.kind == OpKind::Copy || o.kind == OpKind::Reduce ||
                  reduces_from_src(o))
                     ? region_to_py(o.src)
                     : py::object(py::none());
      ops.append(std::move(d));
    }
    steps.append(std::move(ops));
  }
  py::dict out;
  out["steps"] = std::move(steps);
  out["scratch_count"] = s.scratch_count;
  out["algorithm"] = algorithm;
  return out;
}

BufferId parse_buffer(const std::string& b) {
  if (b == "input") return BufferId::Input;
  if (b == "output") return BufferId::Output;
  if (b == "scratch") return BufferId::Scratch;
  throw std::invalid_argument("schedules: unknown buffer '" + b + "' (expected input, output or scratch)");
}

OpKind parse_kind(const std::string& k) {
  for (OpKind v : {OpKind::Send, OpKind::Recv, OpKind::RecvReduce, OpKind::Copy, OpKind::Reduce})
    if (k == op_kind_name(v)) return v;
  throw std::invalid_argument("schedules: unknown op '" + k +
                              "' (expected send, recv, recv_reduce, copy or reduce)");
}

Region region_from_py(py::handle h) {
  auto t = h.cast<py::sequence>();
  if (t.size() != 3) throw std::invalid_argument("schedules: a region is (buffer, offset, count)");
  return Region{parse_buffer(t[0].cast<std::string>()), t[1].cast<int64_t>(), t[2].cast<int64_t>()};
}

Schedule schedule_from_py(py::handle obj) {
  Schedule s;
  py::object steps;
  bool infer_scratch = true;
  if (py::isinstance<py::dict>(obj)) {
    auto d = obj.cast<py::dict>();
    steps = d["steps"];
    if (d.contains("scratch_count")) {
      s.scratch_count = d["scratch_count"].cast<int64_t>();
      infer_scratch = false;
    }
  } else {
    steps = py::reinterpret_borrow<py::object>(obj);
  }
  for (py::handle st : steps) {
    Step step;
    for (py::handle oh : st) {
      auto d = oh.cast<py::dict>();
      Op o;
      o.kind = parse_kind(d["op"].cast<std::string>());
      if (d.contains("peer") && !d["peer"].is_none()) o.peer = d["peer"].cast<int>();
      if (d.contains("dst") && !d["dst"].is_none()) o.dst = region_from_py(d["dst"]);
      if (d.contains("src") && !d["src"].is_none()) o.src = region_from_py(d["src"]);
      if (infer_scratch) {
        for (const Region* g : {&o.dst, &o.src})
          if (g->buf == BufferId::Scratch) s.scratch_count = std::max(s.scratch_count, g->offset + g->count);
      }
      step.ops.push_back(o);
    }
    s.steps.push_back(std::move(step));
  }
  return s;
}

}  // namespace

void bind_schedule(py::module_& m) {
  py::register_exception<VerificationError>(m, "VerificationError", PyExc_AssertionError);

  m.def("algorithms", [](const std::string& collective) { return algorithms(parse_collective(collective)); },
        py::arg("collective"),
        "Registered algorithm names of a collective (\"auto\" not included).");

  m.def(
      "schedule",
      [](const std::string& collective, const std::string& algorithm, int rank, int size, int64_t count,
         int root, const std::string& dtype, std::vector<int> hosts) {
        CollArgs a;
        a.host_of = std::move(hosts);
        a.coll = parse_collective(collective);
        a.rank = rank;
        a.size = size;
        a.count = count;
        a.root = root;
        const int64_t bytes = count * static_cast<int64_t>(dtype_size(parse_dtype(dtype)));
        if (size < 1) throw std::invalid_argument("size: must be >= 1, got " + std::to_string(size));
        if (count < 0) throw std::invalid_argument("count: must be >= 0, got " + std::to_string(count));
        const std::string name = choose_algorithm(a.coll, algorithm, bytes, size);
        return schedule_to_py(build_schedule(a, name), name);
      },
      py::arg("collective"), py::arg("algorithm"), py::arg("rank"), py::arg("size"), py::arg("count"),
      py::arg("root") = 0, py::arg("dtype") = "float32", py::arg("hosts") = std::vector<int>{},
      "One rank's schedule as a dict {steps, scratch_count, algorithm}. `hosts`: every rank's host id "
      "(hierarchical schedules; empty: one host).");

  m.def(
      "verify",
      [](const std::string& collective, const std::string& algorithm, int size, int64_t count, int root) {
        const Collective c = parse_collective(collective);
        py::gil_scoped_release nogil;
        verify_algorithm(c, algorithm, size, count, root);
      },
      py::arg("collective"), py::arg("algorithm"), py::arg("size"), py::arg("count"), py::arg("root") = 0,
      "Symbolically run every rank's schedule (both buffer layouts); raise VerificationError on a bug.");

  m.def(
      "_verify_custom",
      [](const std::string& collective, int size, int64_t count, py::sequence schedules, int root,
         py::object in_place) {
        const Collective c = parse_collective(collective);
        std::vector<Schedule> per_rank;
        for (py::handle h : schedules) per_rank.push_back(schedule_from_py(h));
        std::vector<bool> modes;
        if (in_place.is_none()) {
          modes.push_back(false);
          if (collective_has_in_place(c)) modes.push_back(true);
        } else {
          modes.push_back(in_place.cast<bool>());
        }
        py::gil_scoped_release nogil;
        for (bool ip : modes) verify_schedules(c, per_rank, size, count, root, ip, "custom");
      },
      py::arg("collective"), py::arg("size"), py::arg("count"), py::arg("schedules"), py::arg("root") = 0,
      py::arg("in_place") = py::none(),
      "Verify user-given per-rank schedules (same format as schedule(); a plain list of steps is also "
      "accepted, with scratch_count inferred).");

  m.def(
      "choose_algorithm",
      [](const std::string& collective, const std::string& algorithm, int64_t bytes, int size) {
        return choose_algorithm(parse_collective(collective), algorithm, bytes, size);
      },
      py::arg("collective"), py::arg("algorithm"), py::arg("bytes"), py::arg("size"));

  m.def(
      "set_tuning",
      [](const std::string& collective, const std::vector<std::tuple<int, int64_t, std::string>>& rows) {
        std::vector<TuningRow> v;
        v.reserve(rows.size());
        for (const auto& t : rows) v.push_back(TuningRow{std::get<0>(t), std::get<1>(t), std::get<2>(t)});
        set_tuning(parse_collective(collective), std::move(v));
      },
      py::arg("collective"), py::arg("rows"),
      "Install tuning rows (size, max_bytes, algorithm) for one collective (max_bytes < 0: no limit).");

  m.def("clear_tuning", &clear_tuning);
}

}  // namespace commlib
