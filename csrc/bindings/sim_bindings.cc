// Python binding of the simulator engine: _C.simulate(collective, algorithm, count, elem_bytes,
// root, topology) with the topology as a dict of sim::Topology's fields (commlib/sim builds it).
#include <pybind11/stl.h>

#include <set>

#include "bindings/bindings.h"
#include "sim/simulator.h"

namespace py = pybind11;

namespace commlib {

namespace {

sim::Topology topology_from_dict(const py::dict& d) {
  static const std::set<std::string> known = {
      "host_of", "nic_of", "nics_per_host", "intra_latency_s", "intra_port_Bps", "intra_bus_Bps",
      "inter_latency_s", "nic_Bps", "reduce_s_per_byte", "copy_s_per_byte", "op_overhead_s",
      "step_overhead_s", "chunk_bytes", "cache_bytes", "mem_port_Bps", "mem_reduce_s_per_byte",
      "mem_copy_s_per_byte"};
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
  // The memory tier is optional: without it one tier (the rates above) serves every size.
  t.mem_port_Bps = t.intra_port_Bps;
  t.mem_reduce_s_per_byte = t.reduce_s_per_byte;
  t.mem_copy_s_per_byte = t.copy_s_per_byte;
  if (d.contains("cache_bytes")) {
    get("cache_bytes", t.cache_bytes);
    get("mem_port_Bps", t.mem_port_Bps);
    get("mem_reduce_s_per_byte", t.mem_reduce_s_per_byte);
    get("mem_copy_s_per_byte", t.mem_copy_s_per_byte);
  }
  return t;
}

}  // namespace

void bind_sim(py::module_& m) {
  m.def(
      "simulate",
      [](const std::string& collective, const std::string& algorithm, int64_t count, int elem_bytes, int root,
         const py::dict& topology) {
        const Collective c = parse_collective(collective);
        const sim::Topology t = topology_from_dict(topology);
        sim::Result r;
        {
          py::gil_scoped_release nogil;
          r = sim::simulate(c, algorithm, count, elem_bytes, root, t);
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
        return out;
      },
      py::arg("collective"), py::arg("algorithm"), py::arg("count"), py::arg("elem_bytes"), py::arg("root"),
      py::arg("topology"),
      "Predicted time of one collective: plays every rank's schedule on the topology (sim/simulator.h).");
}

}  // namespace commlib
