// Device guards (device/device.h) from Python, for tests of their nesting: a DeviceGuard as a
// context manager over any device, make_current, and the emulated device's per-thread current
// device (the value CUDA's cudaGetDevice would return), so a test nests guards of several emulated
// devices and reads what each one's end left current, and what driver calls it cost.
#include <memory>
#include <stdexcept>

#include "bindings/bindings.h"
#include "device/device.h"
#include "device/emulated/emulated_rules.h"

namespace py = pybind11;

namespace commlib {

namespace {

struct GuardScope {
  std::shared_ptr<Device> device;
  std::unique_ptr<DeviceGuard> guard;
};

}  // namespace

void bind_device_guards(py::module_& m) {
  py::class_<GuardScope>(m, "DeviceGuard",
                         "with DeviceGuard(device): the device is this thread's current one inside, the previous "
                         "one after (device/device.h). For tests.")
      .def(py::init([](std::shared_ptr<Device> d) { return GuardScope{std::move(d), nullptr}; }), py::arg("device"))
      .def("__enter__",
           [](GuardScope& s) {
             if (s.guard) throw std::logic_error("DeviceGuard: entered twice");
             s.guard = std::make_unique<DeviceGuard>(*s.device);
           })
      .def("__exit__", [](GuardScope& s, py::args) { s.guard.reset(); });
  m.def(
      "make_current", [](Device& d) { d.make_current(); }, py::arg("device"),
      "device.make_current() (cudaSetDevice), as NCCL's set-up calls it. For tests.");
  m.def("emulated_current_device", &emulated_current_device,
        "This thread's current emulated device (-1: none set), as cudaGetDevice would say it.");
  m.def("set_emulated_current_device", &emulated_set_current_device, py::arg("index"),
        "Set this thread's current emulated device (as torch.cuda.set_device would), for tests.");
}

}  // namespace commlib
