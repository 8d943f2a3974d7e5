// One pybind11 module (commlib._C); each subsystem binds itself in its own file.
#pragma once

#include <pybind11/pybind11.h>

#include <cstdint>
#include <exception>
#include <string>
#include <tuple>
#include <vector>

#include "common/types.h"

namespace commlib {
struct CollectiveCall;  // host/communicator.h
struct P2PItem;
struct CodecSpec;  // kernels/codec_spec.h
namespace sim {
struct Topology;
}

void bind_types(pybind11::module_& m);     // bindings/types_bindings.cc
void bind_schedule(pybind11::module_& m);  // bindings/schedule_bindings.cc: schedule(), algorithms() (verify(): verify_bindings.cc)
void bind_kernels(pybind11::module_& m);   // bindings/kernels_bindings.cc: reduce_local() etc. for tests
void bind_transport(pybind11::module_& m);  // bindings/transport_bindings.cc: TcpEndpoint, hmac_sha256
void bind_comm(pybind11::module_& m);      // bindings/comm_bindings.cc: Communicator, Work, errors
void bind_fast_call(pybind11::module_& m); // bindings/fast_call.cc: fast_collective (after bind_comm)
void bind_device(pybind11::module_& m);    // bindings/device_bindings.cc: devices, stream engine (after bind_comm)
void bind_sim(pybind11::module_& m);       // bindings/sim_bindings.cc: simulate()
void bind_shapes(pybind11::module_& m);    // bindings/shape_bindings.cc: pipeline_shape() etc.
void bind_codecs(pybind11::module_& m);   // bindings/codec_bindings.cc: codec_encode() etc.
void bind_device_plan(pybind11::module_& m);  // bindings/device_plan_bindings.cc: device plans, their check

// A codec's spec from the bindings' arguments (codec_bindings.cc), the host's and the device's
// codec bindings alike: an unknown codec or rounding is a ValueError naming the argument.
CodecSpec codec_spec_of(const std::string& codec, int64_t block, const std::string& rounding, uint64_t seed);
// A collective call with compress= (codec_bindings.cc), for the host's and the stream engine's
// bindings alike: only all_reduce, reduce_scatter and all_gather take it (ValueError naming
// `compress`), the codec checked against the dtype.
CollectiveCall compressed_collective_call(Collective coll, const std::string& algo, uintptr_t in, uintptr_t out,
                                          int64_t count, DType dtype, RedOp op, int root, double scale,
                                          const std::string& codec, int64_t block, const std::string& rounding,
                                          uint64_t seed, bool inter_only);

// Sets the Python error for a C++ exception through the one error table (bindings/error_kinds.h:
// CommError family -> commlib's classes, std::invalid_argument -> ValueError, ...). Needs the GIL
// and bind_comm() to have run.
void set_python_error(std::exception_ptr p);

// One rank's schedule in schedule()'s dict (or plain list of steps) format (schedule_bindings.cc).
struct Schedule;
Schedule schedule_from_py(pybind11::handle obj);
// ... and back (schedule()'s dict: steps, step_lanes and window where laned, scratch_count, algorithm).
pybind11::dict schedule_to_py(const Schedule& s, const std::string& algorithm);

// A simulator topology from the dict commlib/sim builds (bindings/sim_bindings.cc); ValueError
// naming the field.
sim::Topology topology_from_dict(const pybind11::dict& d);

// A collective call from the call spec's enums (_C.Collective, _C.DType, _C.RedOp), converted once at
// the Python API's edge (defined in comm_bindings.cc): nothing is parsed back here but the algorithm's name.
CollectiveCall collective_call(Collective coll, const std::string& algo, uintptr_t in, uintptr_t out, int64_t count,
                               DType dtype, RedOp op, int root, double scale);
using P2PTuple = std::tuple<bool, uintptr_t, int64_t, int>;  // (send, address, count, peer)
std::vector<P2PItem> p2p_items(const std::vector<P2PTuple>& items);
}  // namespace commlib
