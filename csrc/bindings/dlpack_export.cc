// DLPack export (bindings/dlpack_abi.h): a "dltensor" capsule over memory an owner object keeps
// alive, for the symmetric pool's CUDA arrays (commlib/device/cuda_array.py: __dlpack__), so that
// torch.from_dlpack and cupy.from_dlpack take them without a copy, bfloat16 included (which
// __cuda_array_interface__ cannot spell). The consumer renames the capsule and calls the deleter
// when its tensor goes, maybe on a thread without the GIL: the deleter takes it to drop the owner.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <cstdint>
#include <stdexcept>
#include <vector>

#include "bindings/dlpack_abi.h"

namespace py = pybind11;

namespace commlib {

namespace {

using namespace dlpack;

struct Export {
  DLManagedTensor managed{};
  std::vector<int64_t> shape;
  PyObject* owner = nullptr;  // a strong reference, dropped by the deleter
};

void delete_export(DLManagedTensor* m) {
  auto* e = static_cast<Export*>(m->manager_ctx);
  const PyGILState_STATE gil = PyGILState_Ensure();
  Py_XDECREF(e->owner);
  delete e;
  PyGILState_Release(gil);
}

// A capsule nobody consumed (still named "dltensor") owns its tensor: the producer's deleter runs.
void capsule_destructor(PyObject* capsule) {
  if (!PyCapsule_IsValid(capsule, "dltensor")) return;  // consumed ("used_dltensor"): the consumer's now
  auto* m = static_cast<DLManagedTensor*>(PyCapsule_GetPointer(capsule, "dltensor"));
  if (m && m->deleter) m->deleter(m);
}

}  // namespace

void bind_dlpack_export(py::module_& m) {
  m.def(
      "dlpack_export",
      [](py::object owner, uintptr_t ptr, const std::vector<int64_t>& shape, int code, int bits, int device_type,
         int device_id) {
        if (bits <= 0 || bits % 8 != 0) throw std::invalid_argument("bits: a whole number of bytes, got " + std::to_string(bits));
        for (int64_t d : shape)
          if (d < 0) throw std::invalid_argument("shape: negative extent");
        auto* e = new Export;
        e->shape = shape;
        e->owner = owner.release().ptr();
        DLTensor& t = e->managed.dl_tensor;
        t.data = reinterpret_cast<void*>(ptr);
        t.device = DLDevice{device_type, device_id};
        t.ndim = static_cast<int32_t>(e->shape.size());
        t.dtype = DLDataType{static_cast<uint8_t>(code), static_cast<uint8_t>(bits), 1};
        t.shape = e->shape.empty() ? nullptr : e->shape.data();
        t.strides = nullptr;  // compact row-major
        t.byte_offset = 0;
        e->managed.manager_ctx = e;
        e->managed.deleter = delete_export;
        return py::capsule(&e->managed, "dltensor", capsule_destructor);
      },
      py::arg("owner"), py::arg("ptr"), py::arg("shape"), py::arg("code"), py::arg("bits"), py::arg("device_type"),
      py::arg("device_id"),
      "A DLPack 'dltensor' capsule of `shape` (row-major) at `ptr`, dtype (code, bits), on DLPack device "
      "(device_type, device_id); `owner` is kept alive until the consumer's tensor goes.");
}

}  // namespace commlib
