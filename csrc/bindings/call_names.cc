// See call_names.h.
#include "bindings/call_names.h"

#include <string>
#include <vector>

#include "schedule/registry.h"

namespace commlib {

namespace {

constexpr int kOps = static_cast<int>(RedOp::kCount);
constexpr int kColls = static_cast<int>(Collective::kCount);

PyObject* g_auto = nullptr;
PyObject* g_op_names[kOps] = {};
std::vector<std::vector<PyObject*>> g_algo_names;  // interned, per collective, registry order
uint64_t g_algo_generation = ~uint64_t{0};         // registry_generation() g_algo_names is from
struct LastName {  // parse_algorithm_name's last name matched by value (a reference held)
  PyObject* obj = nullptr;
  int index = -1;
  uint64_t generation = ~uint64_t{0};
};
LastName g_last_name[kColls];

bool same_name(PyObject* s, PyObject* interned) {
  return s == interned || (PyUnicode_Check(s) && PyUnicode_Compare(s, interned) == 0);
}

void refresh_algorithm_names() {
  const uint64_t gen = registry_generation();
  if (gen == g_algo_generation) return;
  for (auto& names : g_algo_names)
    for (PyObject* n : names) Py_DECREF(n);
  g_algo_names.assign(kColls, {});
  for (int c = 0; c < kColls; ++c)
    for (const auto& name : algorithms(static_cast<Collective>(c)))
      g_algo_names[c].push_back(PyUnicode_InternFromString(name.c_str()));
  g_algo_generation = gen;
}

}  // namespace

void init_call_names() {
  if (g_auto != nullptr) return;
  g_auto = PyUnicode_InternFromString("auto");
  for (int i = 0; i < kOps; ++i) g_op_names[i] = PyUnicode_InternFromString(op_name(static_cast<RedOp>(i)));
  g_algo_names.assign(kColls, {});
  refresh_algorithm_names();
}

bool parse_op_name(PyObject* s, RedOp* op) {
  for (int i = 0; i < kOps; ++i)
    if (s == g_op_names[i]) return *op = static_cast<RedOp>(i), true;
  if (!PyUnicode_Check(s)) return false;
  for (int i = 0; i < kOps; ++i)
    if (PyUnicode_Compare(s, g_op_names[i]) == 0) return *op = static_cast<RedOp>(i), true;
  PyErr_Clear();
  return false;
}

int parse_algorithm_name(Collective c, PyObject* s) {
  if (s == g_auto) return 0;
  refresh_algorithm_names();
  const auto& names = g_algo_names[static_cast<int>(c)];
  // A name made at run time (a list the registry returned, a split, a config file) is another
  // object than the interned one: compared by value, one comparison per name before it (12 and
  // more for all_reduce), which made a named call measurably slower than auto's (about 4% at 8 B,
  // bench/RESULTS_collectives.md session 36). The last such object that matched is kept, with a
  // reference (so its address cannot be another string's), per collective and registry generation.
  LastName& last = g_last_name[static_cast<int>(c)];
  if (s == last.obj && last.generation == g_algo_generation) return last.index;
  for (size_t i = 0; i < names.size(); ++i)
    if (s == names[i]) return static_cast<int>(i) + 1;
  int index = -1;
  if (same_name(s, g_auto)) {
    index = 0;
  } else {
    for (size_t i = 0; i < names.size() && index < 0; ++i)
      if (same_name(s, names[i])) index = static_cast<int>(i) + 1;
  }
  PyErr_Clear();
  if (index >= 0) {
    Py_INCREF(s);
    Py_XDECREF(last.obj);
    last = LastName{s, index, g_algo_generation};
  }
  return index;
}

}  // namespace commlib
