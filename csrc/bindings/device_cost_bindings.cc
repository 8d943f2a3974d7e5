// The kernel path's cost model (policy/device_cost.h) and device auto's ranking of its candidates
// (policy/device_auto.h) for Python: the predictions docs/gpu.md publishes, the tests that pin
// auto's choice to the model, and scripts/gpu_check.sh's `auto_route` step, which measures them.
#include <pybind11/stl.h>

#include "bindings/bindings.h"
#include "policy/device_auto.h"
#include "policy/device_cost.h"

namespace py = pybind11;

namespace commlib {

namespace {

DeviceRoute route_of(const std::string& name) {
  if (name == "mapped") return DeviceRoute::Mapped;
  if (name == "arena") return DeviceRoute::Arena;
  if (name == "slots") return DeviceRoute::Slots;
  throw std::invalid_argument("route: one of mapped, arena, slots, got '" + name + "'");
}

// The model's constants with the grid settings a caller names (KernelAutoInputs::cost; the engine
// passes its kernel path's).
DeviceCostParams grid_params(uint64_t ll_bytes, uint64_t block_bytes) {
  if (block_bytes == 0) throw std::invalid_argument("block_bytes: must be >= 1 (COMMLIB_DEVICE_BLOCK_BYTES), got 0");
  DeviceCostParams p;
  p.one_block_bytes = static_cast<double>(ll_bytes);
  p.block_bytes = static_cast<double>(block_bytes);
  return p;
}
// The bindings' defaults are the model's (DeviceCostParams: the settings' defaults), written once.
const uint64_t kDefaultLL = static_cast<uint64_t>(DeviceCostParams{}.one_block_bytes);
const uint64_t kDefaultBlock = static_cast<uint64_t>(DeviceCostParams{}.block_bytes);

}  // namespace

void bind_device_cost(py::module_& m) {
  m.def(
      "device_auto_candidates",
      [](Collective collective, int size, int64_t count, DType dtype, const std::string& route, uint64_t slots_bytes,
         const std::string& policy_algorithm, uint64_t ll_bytes, uint64_t block_bytes) {
        if (size < 1) throw std::invalid_argument("size: must be >= 1, got " + std::to_string(size));
        if (count < 0) throw std::invalid_argument("count: must be >= 0, got " + std::to_string(count));
        if (collective != Collective::AllReduce && collective != Collective::ReduceScatter)
          throw std::invalid_argument("collective: device auto ranks all_reduce and reduce_scatter only");
        py::list out;
        for (const KernelAutoCandidate& k : kernel_auto_candidates(collective, size, count,
                                                                   static_cast<int>(dtype_size(dtype)),
                                                                   route_of(route), slots_bytes, policy_algorithm,
                                                                   grid_params(ll_bytes, block_bytes))) {
          py::dict d;
          d["algorithm"] = k.algorithm;
          d["seconds"] = k.cost.seconds;
          d["traffic_bytes"] = k.cost.traffic_bytes;
          d["staged_bytes"] = k.cost.staged_bytes;
          d["waits"] = k.cost.waits;
          d["grid_barriers"] = k.cost.grid_barriers;
          d["stage_need"] = k.cost.stage_need;
          d["fits"] = k.fits;
          out.append(d);
        }
        return out;
      },
      py::arg("collective"), py::arg("size"), py::arg("count"), py::arg("dtype") = DType::Float32,
      py::arg("route") = "mapped", py::arg("slots_bytes") = uint64_t{0}, py::arg("policy_algorithm") = "",
      py::arg("ll_bytes") = kDefaultLL, py::arg("block_bytes") = kDefaultBlock,
      "Device auto's candidates for a call of `count` elements on `size` ranks taking `route` (mapped, arena, "
      "slots; `slots_bytes`: the slots area, which a one-sided plan staged there must fit; `policy_algorithm`: "
      "the host policy's choice, a reduce_scatter's message-plan candidate; `ll_bytes`, `block_bytes`: the grid "
      "settings COMMLIB_DEVICE_LL_BYTES and COMMLIB_DEVICE_BLOCK_BYTES, defaults theirs), each {algorithm, seconds, "
      "traffic_bytes, staged_bytes, waits, grid_barriers, stage_need, fits} from the kernel path's cost model "
      "(policy/device_cost.h), in the order auto breaks ties: auto takes the first fastest that fits.");
  m.def(
      "device_auto_choice",
      [](Collective collective, int size, int64_t count, DType dtype, const std::string& route, uint64_t slots_bytes,
         const std::string& policy_algorithm, uint64_t ll_bytes, uint64_t block_bytes) {
        if (size < 2) throw std::invalid_argument("size: device auto's rule needs 2 ranks or more, got " + std::to_string(size));
        if (count < 0) throw std::invalid_argument("count: must be >= 0, got " + std::to_string(count));
        if (collective != Collective::AllReduce && collective != Collective::ReduceScatter)
          throw std::invalid_argument("collective: device auto ranks all_reduce and reduce_scatter only");
        const KernelAutoCall call{collective, 0, count, static_cast<int>(dtype_size(dtype)), policy_algorithm, "size"};
        return kernel_auto_choice(call, size, route_of(route), slots_bytes, grid_params(ll_bytes, block_bytes));
      },
      py::arg("collective"), py::arg("size"), py::arg("count"), py::arg("dtype") = DType::Float32,
      py::arg("route") = "mapped", py::arg("slots_bytes") = uint64_t{0}, py::arg("policy_algorithm") = "",
      py::arg("ll_bytes") = kDefaultLL, py::arg("block_bytes") = kDefaultBlock,
      "What device auto takes on the kernel path for this call and route where no kernel-path tuning row "
      "covers it (policy/device_auto.h rules 2 and 3): `direct` (all_reduce) or `policy_algorithm` "
      "(reduce_scatter) while each rank receives at most 256 KiB, else the cost model's fastest candidate "
      "(`ll_bytes`, `block_bytes` as device_auto_candidates').");
}

}  // namespace commlib
