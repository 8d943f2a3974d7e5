// The device-wide grid budget (stream/grid_claims.h) and the emulated device's shared residency
// (device/emulated/emulated_residency.h), for commlib.emulated and the tests: the claims' counters
// and entries per physical device, and a raw claim (a test's stand-in for another job's engine).
#include <pybind11/stl.h>

#include "bindings/bindings.h"
#include "device/emulated/emulated_device.h"
#include "device/shared_ledger.h"
#include "stream/grid_claims.h"

namespace py = pybind11;

namespace commlib {

void bind_grid_claims(py::module_& m) {
  m.def(
      "grid_claims",
      [](const std::string& device) {
        const GridClaimCounts c = grid_claim_counts(device);
        py::dict d;
        d["claims"] = c.claims;
        d["releases"] = c.releases;
        d["refused"] = c.refused;
        d["reclaimed"] = c.reclaimed;
        py::list entries;
        for (const GridClaimEntry& e : grid_claim_entries(device))
          entries.append(py::make_tuple(e.comm, e.per_rank, e.ranks, e.holders));
        d["entries"] = entries;
        d["ledger"] = grid_claims_ledger(device);
        return d;
      },
      py::arg("device"),
      "The device-wide grid budget of the physical device `device` (Device.physical_id): this process's claims "
      "made, released, refused (granted 0) and reclaimed (of dead processes), the ledger's entries now "
      "(communicator key, blocks per rank, ranks, live holders) and its /dev/shm name.");
  py::class_<GridClaims>(m, "GridClaims", "One engine's claims on the device-wide grid budget (tests).")
      .def(py::init<>())
      .def(
          "claim",
          [](GridClaims& g, const std::string& device, unsigned capacity, uint64_t comm, unsigned per_rank,
             const std::vector<int32_t>& pids) {
            GridClaimRequest r;
            r.device = device;
            r.capacity = capacity;
            r.comm = comm;
            r.per_rank = per_rank;
            r.pids = pids;
            return g.claim(r).per_rank;
          },
          py::arg("device"), py::arg("capacity"), py::arg("comm"), py::arg("per_rank"), py::arg("pids"),
          "Claims per_rank blocks for each of the ranks in processes `pids`; returns the blocks per rank granted.")
      .def("release", &GridClaims::release);
  m.def(
      "physical_id", [](Device& d) { return d.physical_id(); }, py::arg("device"),
      "The identity of the physical device every process using it shares (the PCI bus id on CUDA; "
      "\"emulated:[<COMMLIB_EMULATED_MACHINE>:]<index>\" on the emulated device).");
  m.def("shared_ledger_exists", &shared_ledger_exists, py::arg("name"), "Whether /dev/shm/<name> exists.");
  m.def(
      "emulated_enter_resident",
      [](EmulatedDevice& d) {
        py::gil_scoped_release nogil;  // waits while the device is full
        d.enter_resident();
      },
      py::arg("device"), "A place on the device as a kernel-path block takes it (waits while it is full; tests).");
  m.def("emulated_leave_resident", &EmulatedDevice::leave_resident, py::arg("device"),
        "Gives a place taken by emulated_enter_resident back (tests).");
  m.def(
      "emulated_residency",
      [](EmulatedDevice& d) -> py::tuple {
        const EmulatedResidency* r = d.residency();
        if (!r) return py::make_tuple(std::string(), 0u, uint64_t{0}, 0u);
        return py::make_tuple(r->ledger(), r->limit(), r->reclaimed(), r->client_limit());
      },
      py::arg("device"),
      "(ledger name, limit, places of dead processes reclaimed by this process, this process's places at most: "
      "its MPS share under CUDA_MPS_ACTIVE_THREAD_PERCENTAGE) of an emulated device's shared resident blocks; "
      "('', 0, 0, 0) without a limit.");
}

}  // namespace commlib
