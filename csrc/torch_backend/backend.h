// commlib's torch backend as a C++ c10d::Backend (issue #44): what torch's ProcessGroup calls,
// through its dispatcher ops (c10d::allreduce_, broadcast_, ...), for every group created with
// init_process_group("commlib") / new_group / DeviceMesh.
//
// Calls on plain CPU tensors (contiguous, strided, one dtype the core moves) run on the core
// directly, through the table _C hands out (bindings/core_api.h): no Python on their path.
// Everything else is handed to the Python backend of the same group (commlib/torch/backend.py,
// ProcessGroupCommlib over the same communicator), which stages, checks and explains: CUDA
// tensors, other dtypes, non-contiguous or unequal tensors, sparse tensors, uneven all_to_all,
// the coalesced calls, sends and receives (held back and batched there), shrink. Both sides issue
// their calls on one communicator, whose FIFO keeps them in call order.
#pragma once

#include <torch/csrc/distributed/c10d/Backend.hpp>
#include <torch/csrc/utils/pybind.h>

#include <array>
#include <atomic>
#include <string>

#include "bindings/core_api.h"
#include "torch_backend/python_work.h"
#include "torch_backend/work.h"

namespace commlib {
namespace torch_backend {

// A call of the core's (plan/call.h) from what every collective of the backend names.
CollectiveCall make_call(Collective c, uint8_t algo, DType dt, int64_t count, uintptr_t in, uintptr_t out,
                         int root = 0);

constexpr int kCollectives = static_cast<int>(Collective::kCount);

class CommlibBackend : public c10d::Backend {
 public:
  // `group`: the Python ProcessGroupCommlib of this group; `core`: its communicator's address
  // (_C.core_address); `algos`: CollectiveCall::algo per collective (0: auto); `factory`: builds
  // the C++ backend of a Python group (for shrink).
  CommlibBackend(const CoreApi* api, pybind11::object group, uintptr_t core, int rank, int size,
                 std::array<uint8_t, kCollectives> algos, pybind11::object factory);
  ~CommlibBackend() override;

  const std::string getBackendName() const override { return "commlib"; }
  pybind11::object python_group() const { return group_; }

  c10::intrusive_ptr<c10d::Work> allreduce(std::vector<at::Tensor>& t, const c10d::AllreduceOptions& o) override;
  c10::intrusive_ptr<c10d::Work> allreduce_sparse(std::vector<at::Tensor>& t,
                                                  const c10d::AllreduceOptions& o) override;
  c10::intrusive_ptr<c10d::Work> allreduce_coalesced(std::vector<at::Tensor>& t,
                                                     const c10d::AllreduceCoalescedOptions& o) override;
  c10::intrusive_ptr<c10d::Work> broadcast(std::vector<at::Tensor>& t, const c10d::BroadcastOptions& o) override;
  c10::intrusive_ptr<c10d::Work> reduce(std::vector<at::Tensor>& t, const c10d::ReduceOptions& o) override;
  c10::intrusive_ptr<c10d::Work> allgather(std::vector<std::vector<at::Tensor>>& out, std::vector<at::Tensor>& in,
                                           const c10d::AllgatherOptions& o) override;
  c10::intrusive_ptr<c10d::Work> _allgather_base(at::Tensor& out, at::Tensor& in,
                                                 const c10d::AllgatherOptions& o) override;
  c10::intrusive_ptr<c10d::Work> allgather_coalesced(std::vector<std::vector<at::Tensor>>& out,
                                                     std::vector<at::Tensor>& in,
                                                     const c10d::AllgatherOptions& o) override;
  c10::intrusive_ptr<c10d::Work> allgather_into_tensor_coalesced(std::vector<at::Tensor>& out,
                                                                 std::vector<at::Tensor>& in,
                                                                 const c10d::AllgatherOptions& o) override;
  c10::intrusive_ptr<c10d::Work> gather(std::vector<std::vector<at::Tensor>>& out, std::vector<at::Tensor>& in,
                                        const c10d::GatherOptions& o) override;
  c10::intrusive_ptr<c10d::Work> scatter(std::vector<at::Tensor>& out, std::vector<std::vector<at::Tensor>>& in,
                                         const c10d::ScatterOptions& o) override;
  c10::intrusive_ptr<c10d::Work> reduce_scatter(std::vector<at::Tensor>& out,
                                                std::vector<std::vector<at::Tensor>>& in,
                                                const c10d::ReduceScatterOptions& o) override;
  c10::intrusive_ptr<c10d::Work> _reduce_scatter_base(at::Tensor& out, at::Tensor& in,
                                                      const c10d::ReduceScatterOptions& o) override;
  c10::intrusive_ptr<c10d::Work> reduce_scatter_tensor_coalesced(std::vector<at::Tensor>& out,
                                                                 std::vector<at::Tensor>& in,
                                                                 const c10d::ReduceScatterOptions& o) override;
  c10::intrusive_ptr<c10d::Work> alltoall_base(at::Tensor& out, at::Tensor& in, std::vector<int64_t>& out_splits,
                                               std::vector<int64_t>& in_splits,
                                               const c10d::AllToAllOptions& o) override;
  c10::intrusive_ptr<c10d::Work> alltoall(std::vector<at::Tensor>& out, std::vector<at::Tensor>& in,
                                          const c10d::AllToAllOptions& o) override;
  c10::intrusive_ptr<c10d::Work> barrier(const c10d::BarrierOptions& o) override;
  c10::intrusive_ptr<c10d::Work> send(std::vector<at::Tensor>& t, int dst, int tag) override;
  c10::intrusive_ptr<c10d::Work> recv(std::vector<at::Tensor>& t, int src, int tag) override;
  c10::intrusive_ptr<c10d::Work> recvAnysource(std::vector<at::Tensor>& t, int tag) override;

  // torch's sequence numbers (its debug wrapper, TORCH_DISTRIBUTED_DEBUG=DETAIL, and the flight
  // recorder read them): one per call issued through this backend, ours or handed over.
  void setSequenceNumberForGroup() override { seq_.store(0); }
  uint64_t getSequenceNumberForGroup() override { return seq_.load(); }

  bool supportsShrinking() const override { return true; }
  c10::intrusive_ptr<c10d::Backend> shrink(const std::vector<int64_t>& ranks_to_exclude, int shrink_flags,
                                           const c10::intrusive_ptr<Options>& opts_override) override;
  void setGroupUid(const std::string& pg_uid) override;
  void abort() override;
  void shutdown() override;

 private:
  // A call on the core: blocking (raises commlib's error here) or queued and completed by the
  // completion thread. `finish` runs after the call (copies out of staging tensors).
  c10::intrusive_ptr<c10d::Work> run(const CollectiveCall& call, bool async, c10d::OpType type, const char* name,
                                     std::vector<at::Tensor> outputs, std::function<void()> finish = nullptr);
  // The Python backend's method `method` with torch's arguments; its Work wrapped for C++.
  template <typename... Args>
  c10::intrusive_ptr<c10d::Work> delegate(const char* method, Args&&... args);
  // Sends and receives held back on the Python side go out before a call of ours (p2p.py).
  void flush_held_p2p();
  void stop_completer();
  uint8_t algo(Collective c) const { return algos_[static_cast<int>(c)]; }

  const CoreApi* api_;
  pybind11::object group_;
  pybind11::object factory_;
  void* core_;
  std::array<uint8_t, kCollectives> algos_;
  bool p2p_handed_over_ = false;  // a send or receive went to the Python side (may be held there)
  bool stopped_ = false;
  std::atomic<uint64_t> seq_{0};
  Completer completer_;
};

// (defined here: both backend.cc and data_movement.cc hand calls over)
template <typename... Args>
c10::intrusive_ptr<c10d::Work> CommlibBackend::delegate(const char* method, Args&&... args) {
  seq_.fetch_add(1);
  pybind11::gil_scoped_acquire gil;
  pybind11::object work = group_.attr(method)(std::forward<Args>(args)...);
  return c10::make_intrusive<PythonWork>(std::move(work));
}

}  // namespace torch_backend
}  // namespace commlib
