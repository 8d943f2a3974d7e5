// commlib._C_torch: the C++ c10d::Backend of the "commlib" torch backend (torch_backend/backend.h),
// built against the installed torch by setup.py (torch's headers and libraries, its C++ ABI and
// pybind11 flags). commlib/torch/native.py loads it after checking the torch version it was built
// against (COMMLIB_TORCH_VERSION, also recorded beside the module) against the running one.
#include <torch/csrc/utils/pybind.h>

#include <array>
#include <stdexcept>

#include "torch_backend/backend.h"

namespace py = pybind11;
using commlib::torch_backend::CommlibBackend;
using commlib::torch_backend::kCollectives;

#ifndef COMMLIB_TORCH_VERSION
#error "COMMLIB_TORCH_VERSION: setup.py passes the version of the torch this module is built against"
#endif

namespace {

const commlib::CoreApi* core_api() {
  py::object capsule = py::module_::import("commlib._C").attr("core_api")();
  auto* api = static_cast<const commlib::CoreApi*>(PyCapsule_GetPointer(capsule.ptr(), commlib::kCoreApiCapsule));
  if (api == nullptr) throw py::error_already_set();
  if (api->version != commlib::kCoreApiVersion)
    throw std::runtime_error("commlib._C_torch: commlib._C's core API is version " + std::to_string(api->version) +
                             ", this module was built for " + std::to_string(commlib::kCoreApiVersion) +
                             "; rebuild (scripts/setup.sh)");
  return api;
}

}  // namespace

PYBIND11_MODULE(_C_torch, m) {
  m.doc() = "commlib's torch backend as a C++ c10d::Backend (docs/torch_backend.md)";
  py::module_::import("torch.distributed");  // torch's Backend and Work types, registered first
  static const commlib::CoreApi* api = core_api();
  commlib::torch_backend::init_error_classes(api);
  m.attr("built_torch_version") = COMMLIB_TORCH_VERSION;

  py::class_<CommlibBackend, c10d::Backend, c10::intrusive_ptr<CommlibBackend>>(m, "CommlibBackend")
      .def(py::init([](py::object group, uintptr_t core, int rank, int size, const std::vector<std::string>& algos,
                       py::object factory) {
             // algos: the algorithm name per collective, in Collective order ("auto" or a name)
             std::array<uint8_t, kCollectives> codes{};
             for (size_t i = 0; i < algos.size() && i < codes.size(); ++i) {
               const int code = api->algorithm_index(static_cast<commlib::Collective>(i), algos[i].c_str());
               if (code < 0) throw py::value_error("algorithms: unknown algorithm " + algos[i]);
               codes[i] = static_cast<uint8_t>(code);
             }
             return c10::make_intrusive<CommlibBackend>(api, std::move(group), core, rank, size, codes,
                                                        std::move(factory));
           }),
           py::arg("group"), py::arg("core_address"), py::arg("rank"), py::arg("size"), py::arg("algorithms"),
           py::arg("factory"),
           "The backend of one group over the Python backend `group` (commlib.torch.backend.ProcessGroupCommlib) "
           "and its communicator's core (_C.core_address).")
      .def_property_readonly("python_group", &CommlibBackend::python_group,
                             "The Python backend of this group (calls this backend hands over, the communicator).");
}
