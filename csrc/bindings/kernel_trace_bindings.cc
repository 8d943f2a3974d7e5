// COMMLIB_DEVICE_TRACE's records (stream/kernel_path_trace.cc) for Python: StreamEngine.kernel_trace(),
// which commlib.bench.device_trace turns into the bench's Chrome trace.
#include <pybind11/stl.h>

#include "bindings/bindings.h"
#include "stream/stream_engine.h"

namespace py = pybind11;

namespace commlib {

void bind_kernel_trace(py::module_& m) {
  auto engine = py::reinterpret_borrow<py::class_<StreamEngine, std::shared_ptr<StreamEngine>>>(m.attr("StreamEngine"));
  engine.def(
      "kernel_trace",
      [](StreamEngine& e) {
        py::list out;
        if (!e.kernel_path()) return out;
        std::vector<KernelPath::TraceRecord> records;
        {
          py::gil_scoped_release unlocked;  // a device copy the host waits for
          records = e.kernel_path()->trace();
        }
        for (const auto& r : records) out.append(py::make_tuple(r.block, r.step, r.start_ns, r.end_ns));
        return out;
      },
      "COMMLIB_DEVICE_TRACE=1: the kernel path's latest launch, one (block, step, start_ns, end_ns) per block and "
      "step in that order, the device's clock (%globaltimer); [] when the setting is off or nothing ran. Read "
      "after the call completed.");
  engine.def_property_readonly(
      "kernel_tracing", [](StreamEngine& e) { return e.kernel_path() && e.kernel_path()->tracing(); },
      "Whether this engine's kernel path stamps its launches (COMMLIB_DEVICE_TRACE=1).");
}

}  // namespace commlib
