// The one mapping of C++ errors to Python exceptions, in two steps that every caller shares: an
// exception in flight -> a kind and its message (classify_error), and a kind -> the Python class
// (python_error_class). set_python_error (bindings.h: the bound calls' translator and the fast
// call paths) runs both; the core's C entry (core_api.cc) hands the kind to other extension
// modules, which turn it into a class through the same table (CoreApi::error_class).
#pragma once

#include <pybind11/pybind11.h>

#include <cstdint>
#include <exception>

#include "bindings/core_api.h"

namespace commlib {

// The exception `p` as a kind (ErrorKind::Comm/Mismatch/Peer, or kCoreInvalidArgument,
// kCoreNoMemory, kCoreRendezvousError/kCoreStoreLostError for a StoreError, kCoreOtherError) and its
// message (a StoreError's without its class: the kind carries it).
CoreError classify_error(std::exception_ptr p);

// The Python class a kind is raised as (borrowed): commlib's CommError, MismatchError, PeerError,
// RendezvousError, StoreLostError (commlib.errors, imported at first use), ValueError, MemoryError,
// else RuntimeError. Needs bind_error_classes() to have run, and the GIL.
PyObject* python_error_class(uint32_t kind);

// Creates commlib._C.CommError, MismatchError and PeerError (the classes the table maps to).
void bind_error_classes(pybind11::module_& m);

}  // namespace commlib
