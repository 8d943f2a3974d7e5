#include "bindings/bindings.h"

namespace commlib {
void bind_buffer_view(pybind11::module_& m);       // bindings/buffer_view.cc: the one buffer reader's registrations
void bind_foreign_arrays(pybind11::module_& m);     // bindings/foreign_arrays.cc: __cuda_array_interface__, DLPack
void bind_dlpack_export(pybind11::module_& m);      // bindings/dlpack_export.cc: the symmetric pool's arrays as DLPack
void bind_device_call_cache(pybind11::module_& m);  // bindings/device_call_cache_bindings.cc: the device call cache
void bind_device_guards(pybind11::module_& m);     // bindings/device_guard_bindings.cc: guards for tests
void bind_device_work(pybind11::module_& m);       // bindings/device_work_bindings.cc: DeviceWork (after bind_device)
void bind_peer_buffers(pybind11::module_& m);      // bindings/peer_buffers_bindings.cc (after bind_device)
void bind_core_api(pybind11::module_& m);          // bindings/core_api.cc: the table other modules call
void bind_kernel_trace(pybind11::module_& m);      // bindings/kernel_trace_bindings.cc (after bind_device)
void bind_device_codecs(pybind11::module_& m);     // bindings/device_codec_bindings.cc (after bind_device)
void bind_device_cost(pybind11::module_& m);       // bindings/device_cost_bindings.cc: device auto's cost model
void bind_grid_claims(pybind11::module_& m);       // bindings/grid_claims_bindings.cc (after bind_device)
void bind_verify(pybind11::module_& m);            // bindings/verify_bindings.cc: verify() (after bind_schedule)
void bind_device_engine_setup(pybind11::module_& m);  // bindings/device_engine_setup_bindings.cc (after bind_device)
void bind_engine_nccl(pybind11::module_& m);        // bindings/device_nccl_bindings.cc (after bind_device)
}  // namespace commlib

PYBIND11_MODULE(_C, m) {
  m.doc() = "commlib core: schedules, verifier, kernels, shared-memory transport and executor";
  commlib::bind_types(m);
  commlib::bind_schedule(m);
  commlib::bind_verify(m);
  commlib::bind_kernels(m);
  commlib::bind_transport(m);
  commlib::bind_comm(m);
  commlib::bind_codecs(m);  // after bind_comm: run_compressed takes a Communicator
  commlib::bind_fast_call(m);
  commlib::bind_device(m);
  commlib::bind_device_codecs(m);
  commlib::bind_device_work(m);
  commlib::bind_device_engine_setup(m);
  commlib::bind_engine_nccl(m);
  commlib::bind_buffer_view(m);
  commlib::bind_foreign_arrays(m);
  commlib::bind_dlpack_export(m);
  commlib::bind_device_call_cache(m);
  commlib::bind_device_guards(m);
  commlib::bind_peer_buffers(m);
  commlib::bind_kernel_trace(m);
  commlib::bind_sim(m);
  commlib::bind_shapes(m);
  commlib::bind_device_plan(m);
  commlib::bind_device_cost(m);
  commlib::bind_grid_claims(m);
  commlib::bind_core_api(m);
}
