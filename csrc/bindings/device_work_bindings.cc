// The stream engine's works (stream/device_work.h) from Python: what commlib.core.device_route's
// DeviceWork wraps, and the completion event a caller may ask of one (commlib/device/completion.py);
// and the engine's failure apart from any work (commlib/core/failure.py).
#include "bindings/bindings.h"
#include "bindings/error_kinds.h"
#include "bindings/gil.h"
#include "stream/device_work.h"
#include "stream/stream_engine.h"

namespace py = pybind11;

namespace commlib {

void bind_device_work(py::module_& m) {
  py::class_<DeviceWork, std::shared_ptr<DeviceWork>>(m, "DeviceWork")
      .def("wait", &DeviceWork::wait)
      .def("is_completed", &DeviceWork::is_completed)
      .def("synchronize", &DeviceWork::synchronize, py::call_guard<ReleaseGil>())
      .def_property_readonly("seq", &DeviceWork::seq)
      .def_property_readonly("device", &DeviceWork::device, "The engine's device.")
      .def("completion_event", &DeviceWork::completion_event, py::call_guard<ReleaseGil>(),
           "An event that completes with the call (the call's own, or one the engine's own stream records "
           "after waiting for the done word: one event per ask); None for a call captured in a graph.");

  auto engine = py::reinterpret_borrow<py::class_<StreamEngine, std::shared_ptr<StreamEngine>>>(m.attr("StreamEngine"));
  engine
      .def("raise_if_failed", [](StreamEngine& e) { e.throw_if_call_failed(UINT64_MAX); },
           "Raises the engine's error if it failed (an aborted host side fails it too).")
      .def(
          "async_error",
          [](StreamEngine& e) -> py::object {
            ErrorKind kind;
            std::string message;
            if (!e.async_error(&kind, &message)) return py::none();
            return py::reinterpret_borrow<py::object>(python_error_class(static_cast<uint32_t>(kind)))(message);
          },
          "The engine's failure without a call (ncclCommGetAsyncError's counterpart): the exception every "
          "later call would raise (PeerError naming the rank and the collective, MismatchError, CommError), "
          "or None while it is healthy. Changes nothing.")
      .def("raise_unreported_error",
           [](StreamEngine& e) {
             ErrorKind kind;
             std::string message;
             if (e.take_unreported_error(&kind, &message)) throw_kind(kind, message);
           },
           "After close(): raises the error of a call that failed without any caller being told (a blocking "
           "call that failed last), once.");
}

}  // namespace commlib
