// The one table of op and algorithm names the C++ entry from Python reads (bindings/fast_call.cc:
// host calls and the device call cache alike), as interned Python strings: a string literal in
// user code is the same object, so most lookups are one pointer comparison.
#pragma once

#include <Python.h>

#include <cstdint>

#include "common/types.h"

namespace commlib {

// Interns the names (once, at module import; needs the GIL).
void init_call_names();

// The op named by `s` (a str); false, no Python error set, for anything else.
bool parse_op_name(PyObject* s, RedOp* op);

// 0 for "auto", else 1 + the algorithm's position in algorithms(c) (the registry's index, as
// CollectiveCall::algo); -1 (no Python error set) when `s` names none of them. The names are
// re-read when the registry changed (commlib.register_algorithm at run time): one atomic load. A
// name that is not the interned object is compared by value once and then known by its address
// (the last such name per collective, held).
int parse_algorithm_name(Collective c, PyObject* s);

}  // namespace commlib
