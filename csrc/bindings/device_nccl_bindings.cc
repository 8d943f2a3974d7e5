// StreamEngine's NCCL (stream/nccl_link.h), set up by commlib/device/nccl_comm.py, and the emulated
// NCCL's test hooks (device/emulated/nccl_emulated.h).
#include <pybind11/stl.h>

#include "bindings/bindings.h"
#include "bindings/gil.h"
#include "device/emulated/nccl_emulated.h"
#include "stream/stream_engine.h"

namespace py = pybind11;

namespace commlib {

void bind_engine_nccl(py::module_& m) {
  auto engine = py::reinterpret_borrow<py::class_<StreamEngine, std::shared_ptr<StreamEngine>>>(m.attr("StreamEngine"));
  engine
      .def("nccl_load", [](StreamEngine& e, const std::vector<std::string>& c) { return e.nccl().load(c); })
      .def("nccl_emulated", [](StreamEngine& e) { return e.nccl().from_device(); })
      .def("nccl_ready", [](StreamEngine& e) { return e.nccl().ready(); })
      .def("nccl_unique_id", [](StreamEngine& e) { return py::bytes(e.nccl().unique_id()); })
      .def(
          "nccl_init",
          [](StreamEngine& e, py::bytes id) {
            std::string s = id;
            ReleaseGil nogil;
            e.nccl().init(s);
          },
          "ncclCommInitRank with rank 0's unique id (blocks until every rank joined).")
      .def("nccl_carries_any", [](StreamEngine& e) { return e.nccl().carries_any(); })
      .def("nccl_inject_async_error", [](StreamEngine& e, int code) {
             e.nccl().with_comm([code](const NcclApi& api, NcclComm c) { emulated_nccl_inject_async_error(api, c, code); });
           },
           py::arg("code"), "Tests, emulated NCCL only: ncclCommGetAsyncError reports `code` from now on.")
      .def(
          "nccl_pause_sweep",
          [](StreamEngine& e, int ms) {
            int n = 0;
            e.nccl().with_comm([&](const NcclApi& api, NcclComm c) { n = emulated_nccl_pause_sweep(api, c, ms); });
            return n;
          },
          py::arg("ms"),
          "Tests, emulated NCCL only: the next sweep that holds a send back behind which another to its peer "
          "waits pauses `ms` ms after it and at its end (emulated_nccl_pause_sweep); returns the pauses so far.");
}

}  // namespace commlib
