// The stream engine's works (stream/device_work.h) from Python: what commlib.core.device_route's
// DeviceWork wraps, and the completion event a caller may ask of one (commlib/device/completion.py).
#include "bindings/bindings.h"
#include "bindings/gil.h"
#include "stream/device_work.h"

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
}

}  // namespace commlib
