#include <pybind11/stl.h>

#include "bindings/bindings.h"
#include "common/params.h"
#include "common/shapes.h"
#include "common/types.h"

namespace py = pybind11;

namespace commlib {

// The call spec's enums: the Python API converts its names to these once, at its edge, and
// the bindings take them as they are. Member names are the API's names (common/types.cc).
template <typename E>
void bind_enum(py::module_& m, const char* type, const char* (*name)(E), const char* doc) {
  py::enum_<E> e(m, type, doc);
  for (int i = 0; i < static_cast<int>(E::kCount); ++i) e.value(name(static_cast<E>(i)), static_cast<E>(i));
}

void bind_types(py::module_& m) {
  bind_enum<DType>(m, "DType", dtype_name, "Element types (common/types.h), by the names of commlib.DTYPES.");
  bind_enum<RedOp>(m, "RedOp", op_name, "Reduction operators (common/types.h), by the names of commlib.OPS.");
  bind_enum<Collective>(m, "Collective", collective_name, "Collectives (common/types.h), by their API names.");
  std::vector<std::string> dtypes, ops, colls;
  for (int i = 0; i < static_cast<int>(DType::kCount); ++i) dtypes.push_back(dtype_name(static_cast<DType>(i)));
  for (int i = 0; i < static_cast<int>(RedOp::kCount); ++i) ops.push_back(op_name(static_cast<RedOp>(i)));
  for (int i = 0; i < static_cast<int>(Collective::kCount); ++i)
    colls.push_back(collective_name(static_cast<Collective>(i)));
  m.attr("DTYPES") = dtypes;
  m.attr("OPS") = ops;
  m.attr("COLLECTIVES") = colls;
  m.def("dtype_size", [](DType t) { return dtype_size(t); }, py::arg("dtype"), "Bytes of one element.");
  m.def("dtype_table", [] {
    py::list out;
    for (int i = 0; i < static_cast<int>(DType::kCount); ++i) {
      const DType t = static_cast<DType>(i);
      out.append(py::make_tuple(dtype_name(t), dtype_size(t), !dtype_is_integer(t)));
    }
    return out;
  }, "[(name, element size in bytes, is_float)] for every dtype common/types.h defines, in its "
     "enum order (commlib/device/dtypes.py builds the Python side's one dtype table from it).");

  m.def(
      "buffer_shapes",
      [](Collective collective, int64_t count, int size, int rank, int root) {
        const BufferShapes s = buffer_shapes(collective, count, size, rank, root);
        auto opt = [](int64_t v) { return v < 0 ? py::object(py::none()) : py::object(py::int_(v)); };
        return py::make_tuple(opt(s.input), opt(s.output), opt(s.input_at), opt(s.output_at));
      },
      py::arg("collective"), py::arg("count"), py::arg("size"), py::arg("rank") = 0, py::arg("root") = 0,
      "(input, output, input_at, output_at) for one rank (common/shapes.h): element counts of its "
      "buffers (None: it passes none) and, in place, where the smaller buffer starts inside the "
      "larger one (None: not applicable).");

  // The settings table (common/params.h): Python reads COMMLIB_* variables only through these.
  m.def("settings", [] {
    py::list out;
    for (const Param& p : params()) {
      py::dict d;
      d["name"] = p.name;
      d["type"] = p.type;
      d["default"] = p.fallback;
      d["meaning"] = p.meaning;
      d["range"] = p.integer() ? py::object(py::make_tuple(p.lo, p.hi)) : py::object(py::none());
      out.append(std::move(d));
    }
    return out;
  }, "Every COMMLIB_* variable: [{name, type, default, meaning, range}], in README order; range: (lo, hi) "
     "for int and bytes settings, else None.");
  m.def("setting", [](const std::string& name) { return param_string(name); }, py::arg("name"),
        "The value of a declared COMMLIB_* variable (its default when unset or empty).");
  m.def("setting_is_set", [](const std::string& name) { return param_set(name); }, py::arg("name"),
        "Whether the environment sets a declared COMMLIB_* variable to a non-empty value (its default does "
        "not count).");
  m.def("setting_int", [](const std::string& name) { return param_int(name); }, py::arg("name"),
        "An int or bytes COMMLIB_* variable as an integer, checked against its declared range "
        "(ValueError naming it otherwise).");
  m.def("setting_choice",
        [](const std::string& name, const std::vector<std::string>& allowed) { return param_choice(name, allowed); },
        py::arg("name"), py::arg("allowed"),
        "A name COMMLIB_* variable as the one of `allowed` it names (blanks and case ignored; its default when "
        "unset); ValueError naming it, its value and the choices otherwise.");
}

}  // namespace commlib
