#include "bindings/bindings.h"

PYBIND11_MODULE(_C, m) {
  m.doc() = "commlib core: schedules, verifier, kernels, shared-memory transport and executor";
  commlib::bind_types(m);
  commlib::bind_schedule(m);
  commlib::bind_kernels(m);
  commlib::bind_transport(m);
  commlib::bind_comm(m);
  commlib::bind_fast_call(m);
  commlib::bind_device(m);
  commlib::bind_sim(m);
  commlib::bind_device_plan(m);
}
