// Python bindings of the schedule layer: algorithms(), schedule(), verify(), verify_trace(),
// choose_algorithm(), set_tuning()/clear_tuning(), _verify_custom() and the VerificationError exception.
#include <pybind11/stl.h>
#include <algorithm>
#include <map>

#include "bindings/bindings.h"
#include "common/shapes.h"
#include "schedule/lanes.h"
#include "verify/verifier.h"
#include "policy/auto_policy.h"
#include "policy/device_path_tuning.h"
#include "policy/flag_cutoff.h"
#include "policy/single_copy.h"
#include "policy/stream_stores.h"
#include "stream/kernel_path.h"
#include "schedule/hierarchical_layout.h"
#include "schedule/registry.h"

namespace py = pybind11;

namespace commlib {
namespace {

py::object region_to_py(const Region& g) { return py::make_tuple(buffer_name(g.buf), g.offset, g.count); }

}  // namespace

py::dict schedule_to_py(const Schedule& s, const std::string& algorithm) {
  py::list steps;
  for (const Step& st : s.steps) {
    py::list ops;
    for (const Op& o : st.ops) {
      py::dict d;
      d["op"] = op_kind_name(o.kind);
      const bool comm = names_peer(o.kind);
      d["peer"] = comm ? py::object(py::int_(o.peer)) : py::object(py::none());
      d["dst"] = op_has_dst(o) ? region_to_py(o.dst) : py::object(py::none());
      d["src"] = op_has_src(o) ? region_to_py(o.src) : py::object(py::none());
      if (is_sync(o.kind)) d["tag"] = o.tag;
      ops.append(std::move(d));
    }
    steps.append(std::move(ops));
  }
  py::dict out;
  out["steps"] = std::move(steps);
  // Only a laned schedule names its steps' lanes (ir.h Step::lane) and window: the others' dicts
  // stay as they were, so a caller that edits their steps need not keep step_lanes in line.
  if (s.window != 0 || std::any_of(s.steps.begin(), s.steps.end(), [](const Step& st) { return st.lane != 0; })) {
    py::list lanes;
    for (const Step& st : s.steps) lanes.append(st.lane);
    out["step_lanes"] = std::move(lanes);
    out["window"] = s.window;
    if (s.intra_window != 0) out["intra_window"] = s.intra_window;  // (ir.h Schedule::intra_window)
  }
  out["scratch_count"] = s.scratch_count;
  out["algorithm"] = algorithm;
  return out;
}

namespace {

BufferId parse_buffer(const std::string& b) {
  if (b == "input") return BufferId::Input;
  if (b == "output") return BufferId::Output;
  if (b == "scratch") return BufferId::Scratch;
  throw std::invalid_argument("schedules: unknown buffer '" + b + "' (expected input, output or scratch)");
}

OpKind parse_kind(const std::string& k) {
  for (int v = 0; v <= static_cast<int>(OpKind::ReduceFromAll); ++v)  // every kind (the last one's)
    if (k == op_kind_name(static_cast<OpKind>(v))) return static_cast<OpKind>(v);
  throw std::invalid_argument("schedules: unknown op '" + k +
                              "' (expected send, recv, recv_reduce, copy, reduce, get, get_reduce, put, signal, wait, "
                              "reduce_to_all or reduce_from_all)");
}

Region region_from_py(py::handle h) {
  auto t = h.cast<py::sequence>();
  if (t.size() != 3) throw std::invalid_argument("schedules: a region is (buffer, offset, count)");
  return Region{parse_buffer(t[0].cast<std::string>()), t[1].cast<int64_t>(), t[2].cast<int64_t>()};
}

}  // namespace

// Declared in bindings.h (device_plan_bindings.cc lowers user-given schedules too).
Schedule schedule_from_py(py::handle obj) {
  Schedule s;
  py::object steps;
  bool infer_scratch = true;
  if (py::isinstance<py::dict>(obj)) {
    auto d = obj.cast<py::dict>();
    steps = d["steps"];
    if (d.contains("window")) s.window = d["window"].cast<int>();
    if (d.contains("intra_window")) s.intra_window = d["intra_window"].cast<int>();
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
      if (d.contains("tag") && !d["tag"].is_none()) o.tag = d["tag"].cast<int>();
      if (infer_scratch) {
        // (A get's source and a put's destination are the peer's; reduce_to_all's are everyone's.)
        const bool own_dst = o.kind != OpKind::Put, own_src = o.kind != OpKind::Get && o.kind != OpKind::GetReduce;
        for (const Region* g : {own_dst ? &o.dst : nullptr, own_src ? &o.src : nullptr})
          if (g && g->buf == BufferId::Scratch) s.scratch_count = std::max(s.scratch_count, g->offset + g->count);
      }
      step.ops.push_back(o);
    }
    s.steps.push_back(std::move(step));
  }
  if (py::isinstance<py::dict>(obj) && obj.cast<py::dict>().contains("step_lanes")) {
    const auto lanes = obj.cast<py::dict>()["step_lanes"].cast<std::vector<int>>();
    if (lanes.size() != s.steps.size())
      throw std::invalid_argument("schedules: step_lanes has " + std::to_string(lanes.size()) + " entries for " +
                                  std::to_string(s.steps.size()) + " steps");
    for (size_t i = 0; i < lanes.size(); ++i) s.steps[i].lane = lanes[i];
  }
  return s;
}

namespace {

// Bounds of a schedule from outside the library (the built-ins are proven by the verifier; the
// executor trusts regions, so a user schedule is checked before anything runs it).
void check_user_schedule(const Schedule& s, const CollArgs& a, const std::string& name) {
  const BufferShapes shapes = buffer_shapes(a.coll, a.count, a.size, a.rank, a.root);
  const int64_t limit[3] = {shapes.input, shapes.output, s.scratch_count};
  auto where = [&](size_t step) {
    return name + " schedule of rank " + std::to_string(a.rank) + " (size " + std::to_string(a.size) + ", count " +
           std::to_string(a.count) + ") step " + std::to_string(step) + ": ";
  };
  if (s.scratch_count < 0) throw std::invalid_argument(name + ": scratch_count is negative");
  for (size_t k = 0; k < s.steps.size(); ++k) {
    for (const Op& o : s.steps[k].ops) {
      if (is_one_sided(o.kind))
        throw std::invalid_argument(where(k) + op_kind_name(o.kind) + " is one-sided: an algorithm registered at "
                                    "run time runs on the host executor, which has no mapped buffers (prove "
                                    "one-sided schedules with _verify_custom)");
      const bool comm = o.kind == OpKind::Send || o.kind == OpKind::Recv || o.kind == OpKind::RecvReduce;
      if (comm && (o.peer < 0 || o.peer >= a.size || o.peer == a.rank))
        throw std::invalid_argument(where(k) + "peer " + std::to_string(o.peer) + " is not another rank");
      const bool has_dst = o.kind != OpKind::Send;
      const bool has_src = o.kind == OpKind::Send || o.kind == OpKind::Copy || o.kind == OpKind::Reduce ||
                           reduces_from_src(o);
      for (const Region* g : {has_dst ? &o.dst : nullptr, has_src ? &o.src : nullptr}) {
        if (!g) continue;
        const int64_t cap = limit[static_cast<int>(g->buf)];
        if (g->offset < 0 || g->count < 0 || (g->count > 0 && g->offset + g->count > cap))
          throw std::invalid_argument(where(k) + buffer_name(g->buf) + "[" + std::to_string(g->offset) + ":" +
                                      std::to_string(g->offset + g->count) + "] is outside the buffer (" +
                                      std::to_string(cap < 0 ? 0 : cap) + " elements on this rank)");
      }
    }
  }
}

// A builder written in Python: fn(rank, size, count, root) returns a schedule in schedule()'s
// format. It keeps its reference to fn forever: the registry outlives the interpreter, so it must
// never touch a reference count at exit. Runs with the GIL (the caller released it).
struct PythonBuilder {
  PyObject* fn;
  std::string name;
  Schedule operator()(const CollArgs& a) const {
    py::gil_scoped_acquire gil;
    Schedule s;
    try {
      py::object result = py::reinterpret_borrow<py::object>(fn)(a.rank, a.size, a.count, a.root);
      s = schedule_from_py(result);
    } catch (py::error_already_set& e) {
      throw std::invalid_argument(name + ": the builder raised " + e.what());
    } catch (py::cast_error& e) {
      throw std::invalid_argument(name + ": the builder returned something that is not a schedule (" + e.what() + ")");
    }
    check_user_schedule(s, a, name);
    return s;
  }
};

py::list trait_names(uint32_t t) {
  static const std::pair<uint32_t, const char*> names[] = {
      {kSmallMessages, "small_messages"}, {kLargeMessages, "large_messages"}, {kPowerOfTwo, "power_of_two"},
      {kUserDefined, "user_defined"},     {kOneSided, "one_sided"},           {kHostOnly, "host_only"}};
  py::list out;
  for (const auto& [bit, name] : names)
    if (t & bit) out.append(name);
  return out;
}

}  // namespace

void bind_schedule(py::module_& m) {
  py::register_exception<VerificationError>(m, "VerificationError", PyExc_AssertionError);

  m.def("set_overlap_memo", &sched::set_overlap_memo, py::arg("on"),
        "Test hook: whether the overlapped pipeline reuses a host's aligned intra lanes across its local ranks "
        "(on by default); returns the previous value.");
  m.def("algorithms", [](Collective collective) { return algorithms(collective); }, py::arg("collective"),
        "Registered algorithm names of a collective (\"auto\" not included).");

  m.def(
      "schedule",
      [](Collective collective, const std::string& algorithm, int rank, int size, int64_t count,
         int root, DType dtype, std::vector<int> hosts, const std::string& inter, int64_t segment,
         const std::string& intra, int pieces, int share) {
        if (pieces < 0) throw std::invalid_argument("pieces: must be >= 0, got " + std::to_string(pieces));
        CollArgs a;
        a.host_of = std::move(hosts);
        a.coll = collective;
        a.rank = rank;
        a.size = size;
        a.count = count;
        a.root = root;
        const int64_t bytes = count * static_cast<int64_t>(dtype_size(dtype));
        if (size < 1) throw std::invalid_argument("size: must be >= 1, got " + std::to_string(size));
        if (count < 0) throw std::invalid_argument("count: must be >= 0, got " + std::to_string(count));
        const std::string name = choose_algorithm(a.coll, algorithm, bytes, size);
        a.compose(Composition{name, inter, intra, segment < 0 ? hier_segment_setting() : segment, pieces, share});
        py::dict out = schedule_to_py(build_schedule(a, name), name);
        out["lanes"] = schedule_lanes(a, name); // schedule/lanes.h: step_lanes[i] in [0, lanes)
        return out;
      },
      py::arg("collective"), py::arg("algorithm"), py::arg("rank"), py::arg("size"), py::arg("count"),
      py::arg("root") = 0, py::arg("dtype") = DType::Float32, py::arg("hosts") = std::vector<int>{},
      py::arg("inter") = "", py::arg("segment") = -1, py::arg("intra") = "", py::arg("pieces") = 0, py::arg("share") = 0,
      "One rank's schedule as a dict {steps, scratch_count, algorithm, lanes}, and for a laned schedule also "
      "step_lanes and window (schedule/lanes.h: step_lanes[i] the lane of step i among `lanes`, 1 but for laned "
      "algorithms; window: steps in flight, ir.h Schedule::window, 0 none; intra_window where not 0: "
      "ir.h Schedule::intra_window). `hosts`: every rank's host id "
      "(hierarchical schedules; empty: one host); `inter`: hierarchical's inter-host algorithm (\"\": the "
      "built-in exchange); `segment`: its pipeline segment in elements (-1: COMMLIB_HIER_SEGMENT, 0: none); "
      "`intra`: the intra-host phases' algorithm (\"\": the built-in direct exchanges; needs `inter`); "
      "`pieces`: the most pieces the overlapped pipeline cuts a lane's segment into (0: the builder's cap); "
      "`share`: rail_split's rail rings' share of the buffer in 1/1024 (0: the builder's default).");

  m.def(
      "choose_algorithm",
      [](Collective collective, const std::string& algorithm, int64_t bytes, int size) {
        return choose_algorithm(collective, algorithm, bytes, size);
      },
      py::arg("collective"), py::arg("algorithm"), py::arg("bytes"), py::arg("size"));

  m.def(
      "set_tuning",
      [](Collective collective, const std::vector<py::tuple>& rows) {
        std::vector<TuningRow> v;
        v.reserve(rows.size());
        for (const py::tuple& t : rows) {
          if (t.size() < 3 || t.size() > 5)
            throw std::invalid_argument("rows: expected (size, max_bytes, algorithm[, hosts[, kernel_path]]) tuples");
          TuningRow r{t[0].cast<int>(), t[1].cast<int64_t>(), t[2].cast<std::string>()};
          if (t.size() >= 4) r.hosts = t[3].cast<int>();
          if (t.size() == 5) r.kernel_path = t[4].cast<bool>();
          v.push_back(std::move(r));
        }
        set_tuning(collective, std::move(v));
      },
      py::arg("collective"), py::arg("rows"),
      "Install tuning rows (size, max_bytes, algorithm[, hosts[, kernel_path]]) for one collective (max_bytes < 0: "
      "no limit; hosts: how many hosts the row was measured on, default 1; kernel_path: measured on the device's "
      "kernel path, read only by that path's auto, default False).");

  m.def(
      "clear_tuning",
      [] {
        clear_tuning();
        set_device_path_crossovers({});
        clear_single_copy_crossovers();
        clear_flag_cutoffs();
        clear_streaming_starts();
      },
      "Drop every tuning row, the device_path and single_copy crossovers, the flags cutoffs and the stream starts "
      "(auto's built-in rules again).");
  m.def(
      "set_streaming_starts", [](const std::map<Collective, std::map<int, int64_t>>& table) { set_streaming_starts(table); },
      py::arg("table"),
      "Replace the \"stream\" starts: {collective: {world size: the smallest call (per-rank count x element size) "
      "whose copies use streaming stores, -1 never}}; world sizes without one: the COMMLIB_STREAM_BYTES footprint rule.");
  m.def(
      "streaming_start", [](Collective c, int size) { return streaming_start(c, size); }, py::arg("collective"),
      py::arg("world_size"), "The installed \"stream\" start of (collective, world size), or -2 without one.");
  m.def(
      "set_flag_cutoffs", [](const std::map<Collective, std::map<int, int64_t>>& table) { set_flag_cutoffs(table); },
      py::arg("table"),
      "Replace the \"flags\" cutoffs: {collective: {world size: the largest call (per-rank count x element size) "
      "auto sends through the shared-memory flags, -1 none}}; world sizes without one: while the input fits a slot.");
  m.def(
      "flag_cutoff", [](Collective c, int size) { return flag_cutoff(c, size); }, py::arg("collective"),
      py::arg("world_size"), "The installed \"flags\" cutoff of (collective, world size), or 2**63-1 without one.");
  m.def(
      "set_single_copy_crossovers",
      [](Collective c, const std::map<int, int64_t>& min_bytes, const std::map<int, int64_t>& min_message) {
        std::map<int, SingleCopyCrossover> entries;
        for (const auto& [size, bytes] : min_bytes) entries[size].min_call_bytes = bytes;
        for (const auto& [size, bytes] : min_message) {
          if (!min_bytes.count(size))
            throw std::invalid_argument("single_copy: " + std::string(collective_name(c)) + " min_message for world size " +
                                        std::to_string(size) + " without a min_bytes");
          entries[size].min_message = bytes;
        }
        set_single_copy_crossovers(c, std::move(entries));
      },
      py::arg("collective"), py::arg("min_bytes"), py::arg("min_message") = std::map<int, int64_t>{},
      "Install one collective's \"single_copy\" crossovers (COMMLIB_CMA=auto): {world size: call bytes, -1 never} "
      "and, where an entry names one, {world size: smallest message sent single-copy} (default 64 KiB).");
  m.def(
      "single_copy_min_message",
      [](Collective c, int64_t call_bytes, int size) {
        return single_copy_min_message(single_copy_setting(), c, call_bytes, size);
      },
      py::arg("collective"), py::arg("call_bytes"), py::arg("size"), "Smallest message sent single-copy (-1: none).");
  m.def(
      "set_device_path_crossovers",
      [](const std::map<int, int64_t>& kernel_max_bytes) { set_device_path_crossovers(kernel_max_bytes); },
      py::arg("kernel_max_bytes"),
      "Install the tuning file's \"device_path\" crossovers {world size: bytes}: COMMLIB_DEVICE_PATH=auto takes "
      "the kernel path up to that many bytes per rank (engines created afterwards); {} restores the default.");
  m.def(
      "device_path_crossover", [](int size) { return device_path_crossover(size, kKernelPathMaxBytes); },
      py::arg("size"), "auto's kernel/copy crossover in bytes per rank for a new engine of `size` ranks.");

  m.def(
      "algorithm_info",
      [](Collective collective) {
        py::list out;
        for (const AlgorithmSpec& s : algorithm_specs(collective)) {
          py::dict d;
          d["name"] = s.name;
          d["traits"] = trait_names(s.traits);
          d["summary"] = s.summary;
          out.append(std::move(d));
        }
        return out;
      },
      py::arg("collective"), "The registered algorithms of a collective: [{name, traits, summary}], in index order.");

  m.def(
      "register_algorithm",
      [](Collective collective, const std::string& name, py::function builder, const std::string& summary) {
        AlgorithmSpec spec;
        spec.coll = collective;
        spec.name = name;
        spec.traits = kUserDefined;
        spec.summary = summary;
        PyObject* fn = builder.ptr();
        Py_INCREF(fn);  // never released (PythonBuilder)
        spec.build = PythonBuilder{fn, std::string(collective_name(collective)) + "/" + name};
        register_algorithm(std::move(spec));
      },
      py::arg("collective"), py::arg("name"), py::arg("builder"), py::arg("summary") = "",
      "Register builder(rank, size, count, root) -> schedule as algorithm `name` of `collective`.");
  m.def(
      "unregister_algorithm",
      [](Collective collective, const std::string& name) {
        unregister_algorithm(collective, name);
      },
      py::arg("collective"), py::arg("name"), "Remove the last algorithm registered from Python for `collective`.");
}

}  // namespace commlib
