#include <pybind11/stl.h>

#include "bindings/bindings.h"
#include "common/types.h"

namespace py = pybind11;

namespace commlib {

void bind_types(py::module_& m) {
  std::vector<std::string> dtypes, ops, colls;
  for (int i = 0; i < static_cast<int>(DType::kCount); ++i) dtypes.push_back(dtype_name(static_cast<DType>(i)));
  for (int i = 0; i < static_cast<int>(RedOp::kCount); ++i) ops.push_back(op_name(static_cast<RedOp>(i)));
  for (int i = 0; i < static_cast<int>(Collective::kCount); ++i)
    colls.push_back(collective_name(static_cast<Collective>(i)));
  m.attr("DTYPES") = dtypes;
  m.attr("OPS") = ops;
  m.attr("COLLECTIVES") = colls;
  m.def("dtype_size", [](const std::string& name) { return dtype_size(parse_dtype(name)); });
}

}  // namespace commlib
