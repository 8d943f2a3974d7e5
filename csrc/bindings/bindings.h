// One pybind11 module (commlib._C); each subsystem binds itself in its own file.
#pragma once

#include <pybind11/pybind11.h>

namespace commlib {
void bind_types(pybind11::module_& m);     // bindings/types_bindings.cc
void bind_schedule(pybind11::module_& m);  // bindings/schedule_bindings.cc: schedule(), algorithms(), verify()
void bind_kernels(pybind11::module_& m);   // bindings/kernels_bindings.cc: reduce_local() etc. for tests
void bind_comm(pybind11::module_& m);      // bindings/comm_bindings.cc: Communicator, Work, errors
}  // namespace commlib
