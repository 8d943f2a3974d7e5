// The device plans (kernels/device_plan.h) for tests: a rank's plan as Python data, the check of a
// plan (possibly altered by the test) against its schedule, and the all-ranks sweep check.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include "bindings/bindings.h"
#include "common/types.h"
#include "kernels/device_list.h"
#include "kernels/device_plan.h"
#include "kernels/device_plan_hosts.h"
#include "kernels/one_sided_plan.h"
#include "schedule/lanes.h"
#include "schedule/registry.h"

namespace py = pybind11;

namespace commlib {
namespace {

const char* const kKinds[] = {"send",       "recv", "recv_reduce", "copy", "reduce",          "get",
                              "get_reduce", "put",  "signal",      "wait", "reduce_to_all",
                              "reduce_from_all"};
static_assert(sizeof(kKinds) / sizeof(kKinds[0]) == kplan::kItemKinds, "every item kind has a name");

py::dict plan_to_py(const DevicePlan& p) {
  py::list steps, items;
  for (const kplan::PlanStep& s : p.steps) steps.append(py::make_tuple(s.first, s.count));
  for (const kplan::PlanItem& it : p.items) {
    py::dict d;
    d["kind"] = kKinds[it.kind];
    d["peer"] = it.peer;
    d["chunk"] = it.chunk;
    d["bytes"] = it.bytes;
    d["dst_buf"] = static_cast<int>(it.dst_buf);
    d["dst_off"] = it.dst_off;
    d["src_buf"] = static_cast<int>(it.src_buf);
    d["src_off"] = it.src_off;
    items.append(std::move(d));
  }
  py::dict out;
  out["steps"] = steps;
  out["items"] = items;
  out["sends_to"] = p.sends_to;
  out["recvs_from"] = p.recvs_from;
  out["chunk_bytes"] = p.chunk_bytes;
  out["esize"] = p.esize;
  out["widest_step"] = p.widest_step;
  out["reduces"] = p.reduces;
  out["one_sided"] = p.one_sided;
  out["peer_bufs"] = p.peer_bufs;
  return out;
}

DevicePlan plan_from_py(const py::dict& d) {
  DevicePlan p;
  for (py::handle h : d["steps"].cast<py::list>()) {
    auto t = h.cast<std::pair<uint32_t, uint32_t>>();
    p.steps.push_back(kplan::PlanStep{t.first, t.second});
  }
  for (py::handle h : d["items"].cast<py::list>()) {
    py::dict i = h.cast<py::dict>();
    kplan::PlanItem it;
    const std::string kind = i["kind"].cast<std::string>();
    it.kind = 0xff;
    for (uint8_t k = 0; k < kplan::kItemKinds; ++k)
      if (kind == kKinds[k]) it.kind = k;
    it.peer = i["peer"].cast<int32_t>();
    it.chunk = i["chunk"].cast<uint32_t>();
    it.bytes = i["bytes"].cast<uint32_t>();
    it.dst_buf = static_cast<uint8_t>(i["dst_buf"].cast<int>());
    it.dst_off = i["dst_off"].cast<int64_t>();
    it.src_buf = static_cast<uint8_t>(i["src_buf"].cast<int>());
    it.src_off = i["src_off"].cast<int64_t>();
    p.items.push_back(it);
  }
  p.sends_to = d["sends_to"].cast<std::vector<uint32_t>>();
  p.recvs_from = d["recvs_from"].cast<std::vector<uint32_t>>();
  p.chunk_bytes = d["chunk_bytes"].cast<uint64_t>();
  p.esize = d["esize"].cast<size_t>();
  p.widest_step = d["widest_step"].cast<uint32_t>();
  p.reduces = d["reduces"].cast<bool>();
  p.one_sided = d.contains("one_sided") && d["one_sided"].cast<bool>();
  p.peer_bufs = d.contains("peer_bufs") ? d["peer_bufs"].cast<uint8_t>() : 0;
  return p;
}

// What the device runs of the schedule (a laned list's rounds merged: kernels/device_list.h), on a
// host map (`hosts`: every rank's host id; empty: one host).
Schedule schedule_of(Collective coll, const std::string& algo, int rank, int size, int64_t count, int root,
                     const std::vector<int>& hosts = {}) {
  if (!hosts.empty() && static_cast<int>(hosts.size()) != size)
    throw std::invalid_argument("hosts: " + std::to_string(hosts.size()) + " entries for " + std::to_string(size) + " ranks");
  CollArgs a{coll, rank, size, count, root};
  a.host_of = hosts;
  return device_list(build_schedule(a, algo), schedule_lanes(a, algo));
}

}  // namespace

void bind_device_plan(py::module_& m) {
  m.def(
      "device_plan",
      [](Collective coll, const std::string& algo, int rank, int size, int64_t count, int root, size_t esize,
         uint64_t chunk_bytes, const std::vector<int>& hosts) {
        return plan_to_py(
            lower_schedule(schedule_of(coll, algo, rank, size, count, root, hosts), rank, size, esize, chunk_bytes));
      },
      py::arg("collective"), py::arg("algorithm"), py::arg("rank"), py::arg("size"), py::arg("count"),
      py::arg("root") = 0, py::arg("esize") = 4, py::arg("chunk_bytes") = 262144, py::arg("hosts") = std::vector<int>{},
      "One rank's device plan (the kernel path's lowering of what the device runs of its schedule: a laned list's "
      "rounds merged, kernels/device_list.h) as a dict. `hosts`: every rank's host id (empty: one host).");
  m.def(
      "device_list",
      [](const py::dict& schedule, int lanes) {
        const Schedule s = schedule_from_py(schedule);
        py::dict out = schedule_to_py(device_list(s, lanes), schedule.contains("algorithm")
                                                                  ? schedule["algorithm"].cast<std::string>()
                                                                  : std::string("custom"));
        out["merged"] = device_merges_rounds(s, lanes);
        return out;
      },
      py::arg("schedule"), py::arg("lanes"),
      "What the device paths run of one rank's schedule (schedule()'s dict) of `lanes` lanes: its lanes' k-th "
      "steps merged into one step where the lanes are listed in round order or under a window "
      "(kernels/device_list.h), else the list as it is; `merged` says which.");
  m.def(
      "check_device_plan",
      [](const py::dict& plan, Collective coll, const std::string& algo, int rank, int size, int64_t count,
         int root) {
        const DevicePlan p = plan_from_py(plan);
        return check_device_plan(p, schedule_of(coll, algo, rank, size, count, root), rank, size, p.esize);
      },
      py::arg("plan"), py::arg("collective"), py::arg("algorithm"), py::arg("rank"), py::arg("size"), py::arg("count"),
      py::arg("root") = 0, "'' when `plan` is the schedule's lowering for this rank, else what differs.");
  m.def(
      "check_device_plans",
      [](Collective coll, const std::string& algo, int size, int64_t count, int root, size_t esize,
         uint64_t chunk_bytes, std::vector<int> hosts, int64_t segment, int pieces) {
        if (!hosts.empty() && static_cast<int>(hosts.size()) != size)
          throw std::invalid_argument("hosts: " + std::to_string(hosts.size()) + " entries for " + std::to_string(size) + " ranks");
        py::gil_scoped_release nogil;
        return check_device_plans_on_hosts(coll, Composition{algo, "", "", segment, pieces}, size, hosts, count, root,
                                           esize, chunk_bytes);
      },
      py::arg("collective"), py::arg("algorithm"), py::arg("size"), py::arg("count"), py::arg("root") = 0,
      py::arg("esize") = 4, py::arg("chunk_bytes") = 262144, py::arg("hosts") = std::vector<int>{},
      py::arg("segment") = 0, py::arg("pieces") = 0,
      "Lower every rank's schedule, check each plan against its schedule and the pairs across ranks; "
      "RuntimeError naming the rank and the difference; returns the chunks checked that cross hosts. `hosts`: every rank's host id (hierarchical and "
      "rail schedules; empty: one host), with their pipeline `segment` and `pieces` (rail_lanes: its lanes).");
  m.def(
      "check_one_sided_plans",
      [](Collective coll, py::sequence schedules, int64_t count, size_t esize) {
        std::vector<DevicePlan> plans;
        const int size = static_cast<int>(schedules.size());
        for (int r = 0; r < size; ++r) {
          const Schedule s = schedule_from_py(schedules[r]);
          plans.push_back(lower_schedule(s, r, size, esize, 0));
          const std::string why = check_device_plan(plans.back(), s, r, size, esize);
          if (!why.empty()) throw std::runtime_error("rank " + std::to_string(r) + ": " + why);
        }
        const std::string why = check_one_sided_pairs(plans, coll, count, esize);
        if (!why.empty()) throw std::runtime_error(why);
      },
      py::arg("collective"), py::arg("schedules"), py::arg("count"), py::arg("esize") = 4,
      "Lower user-given one-sided schedules (schedule()'s format, rank r's at index r) and run the "
      "plan checks, across ranks too; RuntimeError naming what fails.");
}

}  // namespace commlib
