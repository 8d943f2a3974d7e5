// commlib's torch backend as a C++ c10d::Backend (issue #44): what torch's ProcessGroup calls,
// through its dispatcher ops (c10d::allreduce_, broadcast_, ...), for every group created with
// init_process_group("commlib") / new_group / DeviceMesh.
//
// Calls on CPU tensors run on the core directly, through the table _C hands out
// (bindings/core_api.h): no Python on their path. That is every collective, the coalesced ones,
// uneven all-to-all, sends and receives (held back and batched here, p2p.h). A non-contiguous
// tensor is copied to a contiguous one and, when it is an output, copied back (as gloo does).
// Reductions of dtypes the core does not reduce go through a staging buffer (reductions.cc), and
// sparse all_reduce, uneven lists and several tensors per call run here too (several.cc). What
// remains is handed to the Python backend of the same group (commlib/torch/backend.py,
// ProcessGroupCommlib over the same communicator): shrink, the life cycle's closing, and tensors on
// a device neither path here takes (an argument
// error is raised here first, as it words it: argument_errors.h). Staged calls take one layer on both devices (staging.h: CPU tensors on the
// core, CUDA tensors on the current stream, device_staged.cc). Both sides issue their calls on one
// communicator, whose FIFO keeps them in call order.
#pragma once

#include <torch/csrc/distributed/c10d/Backend.hpp>
#include <torch/csrc/utils/pybind.h>

#include <array>
#include <atomic>
#include <functional>
#include <string>

#include "bindings/core_api.h"
#include "torch_backend/device_calls.h"
#include "torch_backend/p2p.h"
#include "torch_backend/python_work.h"
#include "torch_backend/staging.h"
#include "torch_backend/tensor_for_core.h"
#include "torch_backend/work.h"

namespace commlib {
namespace torch_backend {

// A call of the core's (plan/call.h) from what every collective of the backend names.
CollectiveCall make_call(Collective c, uint8_t algo, DType dt, int64_t count, uintptr_t in, uintptr_t out,
                         int root = 0);

constexpr int kCollectives = static_cast<int>(Collective::kCount);

// torch's per-call timeout (opts.timeout; kUnsetTimeout when not given) as the core takes it:
// seconds, 0 for the communicator's own.
inline double timeout_seconds(std::chrono::milliseconds t) { return t.count() > 0 ? t.count() / 1000.0 : 0.0; }

// torch's op as the core's (false where the Python side must decide: it explains), as every
// reduction here reads it with reduction_dtype (tensor_for_core.h).
bool reduction_op(const c10d::ReduceOp& op, DType dt, RedOp* out, double* scale);
// How the core reduces a CPU tensor of any dtype it can (staging.py's reduction_staging, in C++): a
// staging buffer of dtype `stage` (the tensor itself when it is a contiguous one already), the core's
// dtype and op on it, and how many core elements one tensor element is (complex: a pair of reals).
// bool as uint8 (sum, max, bor, avg as max; product, min, band as min), complex as pairs of reals
// (sum, avg, premul_sum), other integers in int64 (avg, premul_sum: float64), other floats in
// float32; conjugate and negative views through a resolved copy. Copied back with a cast.
struct Reduction {
  at::ScalarType stage;
  DType dt;
  RedOp op;
  double scale = 1.0;
  int64_t reals = 1;
};
// False when `t` is not a CPU strided tensor of such a dtype, or the op is one the Python side
// explains; throws ValueError (naming `op`) for an op the dtype does not define.
bool reduction_of(const at::Tensor& t, const c10d::ReduceOp& op, Reduction* r);
// reduction_of on a strided tensor of any device (the caller checked where it lives: staging.h).
bool reduction_in(const at::Tensor& t, const c10d::ReduceOp& op, Reduction* r);
// `t`'s values as a contiguous tensor of r.stage: `t` itself when it is one already.
at::Tensor staged_for(const at::Tensor& t, const Reduction& r);
// A CUDA tensor a send or receive moves (through a contiguous copy when it is not contiguous).
bool device_p2p_layout(const at::Tensor& t);
// `t` itself when contiguous, else a contiguous copy (which a call's finish copies back into `t`
// when `t` is an output: CopyBack).
inline at::Tensor dense(const at::Tensor& t) { return t.is_contiguous() ? t : t.contiguous(); }
// Copies the staged outputs back into the caller's tensors (pairs: caller's, staged).
struct CopyBack {
  std::vector<std::pair<at::Tensor, at::Tensor>> pairs;
  void add(const at::Tensor& user, const at::Tensor& staged) {
    if (!staged.is_same(user)) pairs.emplace_back(user, staged);
  }
  bool empty() const { return pairs.empty(); }
  void operator()() {
    for (auto& p : pairs) p.first.copy_(p.second);
  }
};

// A collective of device tensors run as one batch of the stream engine (device_lists.cc): the
// messages (at most one send to and one receive from each peer; each tensor contiguous on the call's
// device), this rank's own block (`own.first` <- `own.second`, copied on the stream before the batch;
// undefined: none) and the receives that land in a contiguous copy (`back`: caller's, staged; copied
// on the stream after it).
struct DeviceBatch {
  struct Message {
    bool send;
    at::Tensor tensor;
    int peer;
  };
  std::vector<Message> messages;
  std::pair<at::Tensor, at::Tensor> own;
  std::vector<std::pair<at::Tensor, at::Tensor>> back;
  // An all-to-all (the uneven all_to_all_single, the list form): the batch is numbered as a
  // collective (core_api.h device_all_to_allv), its messages counted in elements of `dtype`,
  // `a2av_count` the elements this rank sends; -1: a plain batch (gather, scatter).
  int64_t a2av_count = -1;
  DType dtype = DType::UInt8;
};
// The dtype an all-to-all moves a tensor's blocks as: its own where the core knows it, else bytes
// (as the Python backend's staging.as_bytes), so the calls' descriptors agree on either backend.
DType a_to_a_dtype(const at::Tensor& t);
// The bytes of one element of `dt` (here: common/types.cc's dtype_size is the core's, not linked in).
int64_t element_bytes(DType dt);
// The batches of gather and scatter (one body, mirror images: `root_receives` for gather, whose root
// receives block j into list[j]; scatter's root sends list[j] to rank j; the root copies its own
// block) and of the list all_to_all, from tensors ready to move.
DeviceBatch rooted_batch(const at::Tensor& mine, const std::vector<at::Tensor>& list, int root, int me,
                         bool root_receives);
DeviceBatch alltoall_batch(const std::vector<at::Tensor>& outs, const std::vector<at::Tensor>& ins, int me);

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
  // batch_isend_irecv and _coalescing_manager(group, device): one work for the block (p2p.cc).
  bool supportsCoalescing() const override { return true; }
  void startCoalescing() override;
  c10::intrusive_ptr<c10d::Work> endCoalescing() override;
  c10::intrusive_ptr<c10d::Backend> shrink(const std::vector<int64_t>& ranks_to_exclude, int shrink_flags,
                                           const c10::intrusive_ptr<Options>& opts_override) override;
  void setGroupUid(const std::string& pg_uid) override;
  void abort() override;
  void shutdown() override;

  // A device call offered to the communicator's device call cache as the CUDA path offers it
  // (device_calls.cc): its work, or null when the cache does not hold it. `kind`: the buffers' kind
  // (device_calls.h) on device index `device`, `stream_id` the stream as the cache keys it, `issued` as c10 names it. Public
  // for the module's test seam, which drives it with emulated-device memory.
  c10::intrusive_ptr<c10d::Work> device_run(const CollectiveCall& call, uint8_t kind, bool two_buffers,
                                            int device, uintptr_t stream_id, c10::Stream issued,
                                            c10d::OpType type, const char* name, const at::Tensor& output,
                                            const at::Tensor& input);
  // A send or receive of device memory held back as a CUDA tensor's is (device_p2p.cc): `t` on
  // `device` of `kind`, called on the stream `stream_id` (as the device call cache keys it; `stream`
  // as c10 names it). Public for the module's test seam (emulated-device memory).
  c10::intrusive_ptr<c10d::Work> hold_device_message(bool send, const at::Tensor& t, int peer, uint8_t kind,
                                                     int device, uintptr_t stream_id, c10::Stream stream);
  // An uneven all-to-all of device memory as one batch of the stream engine (device_p2p.cc):
  // block j of `in` (in_bytes[j] bytes) to rank j, block i of `out` from rank i, on `stream` (as
  // hold_device_message names it), this rank's own block copied there first; `user` (when defined)
  // gets `out` copied back after the batch. Public for the module's test seam.
  c10::intrusive_ptr<c10d::Work> device_exchange(const at::Tensor& in, const at::Tensor& out,
                                                 const std::vector<int64_t>& in_bytes,
                                                 const std::vector<int64_t>& out_bytes, DType dt, uint8_t kind,
                                                 int device, uintptr_t stream_id, c10::Stream stream, at::Tensor user);
  // A collective of device memory as one batch of the stream engine (device_lists.cc: gather, scatter,
  // the list all_to_all; device_exchange), on `stream` (as hold_device_message names it), after every
  // message held before it; its work. Public for the module's test seam.
  c10::intrusive_ptr<c10d::Work> device_batch(DeviceBatch batch, c10d::OpType type, const char* name,
                                              std::vector<at::Tensor> outputs, uint8_t kind, int device,
                                              uintptr_t stream_id, c10::Stream stream);
  // A staged call (staging.h) on device memory (device_staged.cc): `s.call` offered as device_run
  // offers one, then `s.after` ordered behind it on `stream` (a CUDA stream: enqueued there, an event
  // recorded after it for the work's completion; a CPU stream, the emulated seam's: on the host once
  // the call ran), the staged buffers held until the engine retired the call. Null when the call
  // was not enqueued (the caller hands it over). Public for the module's test
  // seam, which builds its StagedCall over emulated-device memory.
  c10::intrusive_ptr<c10d::Work> device_staged(StagedCall s, uint8_t kind, bool two_buffers, int device,
                                               uintptr_t stream_id, c10::Stream stream, c10d::OpType type,
                                               const char* name, std::vector<at::Tensor> outputs);
  // Runs `f` under the mutex of the held sends and receives, as a flush does (test seam).
  void while_p2p_locked(const std::function<void()>& f) { hold_->while_locked(f); }
  // Batches of held host sends and receives issued to the core, for tests.
  uint64_t host_p2p_batches() const { return hold_->host_batches(); }
  // Works done_work made (not reused), for tests.
  uint64_t blocking_works_made() const { return works_made_.load(std::memory_order_relaxed); }
  // Device calls whose tensors are still held (not seen retired), for tests.
  size_t device_calls_held() { return devices_.held(); }
  // CudaWorks the device calls' pool keeps, for tests.
  size_t device_works_pooled() { return devices_.pooled_works(); }

 private:
  // A call on the core: blocking (raises commlib's error here) or queued and completed by the
  // completion thread. `finish` runs after the call (copies out of staging tensors).
  c10::intrusive_ptr<c10d::Work> run(const CollectiveCall& call, bool async, c10d::OpType type, const char* name,
                                     const std::vector<at::Tensor>& outputs, std::function<void()> finish = nullptr,
                                     std::chrono::milliseconds timeout = c10d::kUnsetTimeout);
  // A batch of sends and receives on the core as one call, as run(), `items` counted in elements of
  // `dt`: with `a2av_count` -1 a plain batch (the core's p2p: several.cc's uneven all_gather); else
  // the core's all_to_all with split sizes, `a2av_count` the elements this rank sends, numbered as a
  // collective (exchange.cc), as DeviceBatch::a2av_count tells the two apart on the device.
  c10::intrusive_ptr<c10d::Work> run_items(const std::vector<P2PItem>& items, DType dt, int64_t a2av_count, bool async,
                                           c10d::OpType type, const char* name,
                                           const std::vector<at::Tensor>& outputs, std::function<void()> finish,
                                           std::chrono::milliseconds timeout);
  // What run() and run_items() share: `issue(async, &work, &err)` puts the call on the core.
  template <typename Issue>
  c10::intrusive_ptr<c10d::Work> submit(Issue&& issue, bool async, c10d::OpType type, const char* name,
                                        const std::vector<at::Tensor>& outputs, std::function<void()> finish);
  // The work of a blocking call that ran (outside a coalescing block): done, its outputs held weakly
  // (CommlibWork::rearm_done). The spare work, the one returned last, is reused when nobody else
  // holds it any more (torch's wrapper waits on it and drops it): a blocking call then allocates
  // no Work. Thread-safe (the spare is taken and put back with an atomic exchange).
  c10::intrusive_ptr<c10d::Work> done_work(c10d::OpType type, const char* name, const std::vector<at::Tensor>& outputs);
  // An uneven all-to-all of contiguous buffers: block j of `in` (in_bytes[j] bytes) goes to rank j,
  // block i of `out` comes from rank i, as elements of `dt` (a_to_a_dtype: as the Python backend
  // moves them); `finish` runs after (and copies this rank's own block). The core's all_to_all with
  // split sizes, numbered as a collective (core_api.h all_to_allv), as commlib's own routes run it.
  c10::intrusive_ptr<c10d::Work> exchange(const at::Tensor& in, const at::Tensor& out,
                                          const std::vector<int64_t>& in_bytes, const std::vector<int64_t>& out_bytes,
                                          DType dt, bool async, c10d::OpType type, const char* name,
                                          std::vector<at::Tensor> outputs, std::function<void()> finish,
                                          std::chrono::milliseconds timeout);
  // A staged call (staging.h) of CPU tensors on the core, as run(): `s.after` as its finish.
  c10::intrusive_ptr<c10d::Work> run_staged(StagedCall s, bool async, c10d::OpType type, const char* name,
                                            const std::vector<at::Tensor>& outputs, std::chrono::milliseconds timeout);
  // A staged call of CUDA tensors on `first`'s device and current stream (device_staged.cc); null when
  // `first` is no CUDA tensor, the builder took none, or the call was not enqueued (handed over).
  // `build(on, &s)`: the staging.h builder of the call.
  c10::intrusive_ptr<c10d::Work> cuda_staged(const at::Tensor& first, bool two_buffers, c10d::OpType type,
                                             const char* name, std::vector<at::Tensor> outputs,
                                             const std::function<bool(const StageOn&, StagedCall*)>& build);
  // all_reduce or reduce of one CPU tensor of any dtype reduction_of takes, through its staging
  // buffer (reductions.cc); null when it takes none.
  c10::intrusive_ptr<c10d::Work> staged_reduction(Collective c, std::vector<at::Tensor>& t, const c10d::ReduceOp& op,
                                                  int root, bool async, std::chrono::milliseconds timeout);
  // Calls of several tensors, uneven lists and sparse tensors (several.cc): torch's contract for a
  // list of tensors (gloo's): all_reduce reduces every tensor of every rank into each, broadcast
  // sends the root's opts.rootTensor to every tensor, all_gather gathers every input of every rank
  // into each output list; null when the tensors are not CPU ones the core moves (handed over).
  c10::intrusive_ptr<c10d::Work> several_allreduce(std::vector<at::Tensor>& t, const c10d::AllreduceOptions& o);
  c10::intrusive_ptr<c10d::Work> several_broadcast(std::vector<at::Tensor>& t, const c10d::BroadcastOptions& o);
  c10::intrusive_ptr<c10d::Work> several_allgather(std::vector<std::vector<at::Tensor>>& out,
                                                   std::vector<at::Tensor>& in, const c10d::AllgatherOptions& o);
  c10::intrusive_ptr<c10d::Work> uneven_allgather(std::vector<at::Tensor>& outs, const at::Tensor& in,
                                                  const c10d::AllgatherOptions& o);
  // Calls on CUDA tensors (device_calls.cc): run on the current stream from here when the device
  // call cache holds them; null otherwise (a CPU tensor, a layout or op the Python path stages, a
  // call not cached yet), and the caller hands the call over.
  c10::intrusive_ptr<c10d::Work> cuda_call(const CollectiveCall& call, bool two_buffers, const at::Tensor& first,
                                           c10d::OpType type, const char* name, const at::Tensor& output,
                                           const at::Tensor& input);
  c10::intrusive_ptr<c10d::Work> cuda_reduction(Collective c, std::vector<at::Tensor>& t, const c10d::ReduceOp& op,
                                                int root, c10d::OpType type, const char* name);
  c10::intrusive_ptr<c10d::Work> cuda_broadcast(std::vector<at::Tensor>& t, int root);
  c10::intrusive_ptr<c10d::Work> cuda_allgather_base(at::Tensor& out, at::Tensor& in);
  c10::intrusive_ptr<c10d::Work> cuda_reduce_scatter_base(at::Tensor& out, at::Tensor& in, const c10d::ReduceOp& op);
  c10::intrusive_ptr<c10d::Work> cuda_alltoall_base(at::Tensor& out, at::Tensor& in);  // equal blocks
  // gather, scatter and the list all_to_all of CUDA tensors as one batch each (device_lists.cc);
  // null for CPU tensors and for argument errors (the Python backend names them).
  c10::intrusive_ptr<c10d::Work> cuda_gather(std::vector<std::vector<at::Tensor>>& out, std::vector<at::Tensor>& in,
                                             int root);
  c10::intrusive_ptr<c10d::Work> cuda_scatter(std::vector<at::Tensor>& out, std::vector<std::vector<at::Tensor>>& in,
                                              int root);
  c10::intrusive_ptr<c10d::Work> cuda_alltoall(std::vector<at::Tensor>& out, std::vector<at::Tensor>& in);
  // The coalesced calls on CUDA tensors (allreduce_coalesced: `out` and `in` the same list): pair i
  // through `from_cpp(i)` (a cuda_* method above; null when not cached), else `hand_over(i)` (the
  // Python backend's single-tensor method), in order, under one CoalescedWork. Null when the lists
  // differ in length or a tensor is not on the first one's CUDA device.
  using WorkPtr = c10::intrusive_ptr<c10d::Work>;
  WorkPtr cuda_coalesced(std::vector<at::Tensor>& out, std::vector<at::Tensor>& in,
                         const std::function<WorkPtr(size_t)>& from_cpp, const std::function<WorkPtr(size_t)>& hand_over);
  // A send or receive of a CUDA tensor, held back (device_p2p.cc); issue_device_round issues one
  // batch of them (P2PHold's device issuer), through python_batch while the device route has run
  // nothing on the batch's stream.
  c10::intrusive_ptr<c10d::Work> cuda_p2p(bool send, const at::Tensor& t, int peer);
  // `a2av`: the round is one all-to-all's batch, numbered as a collective (DeviceBatch::a2av_count).
  bool issue_device_round(const std::vector<P2PHold::Held*>& round, CoreError* err, const DeviceBatch* a2av = nullptr);
  bool python_batch(const std::vector<P2PHold::Held*>& round, std::shared_ptr<DeviceWork>* work, CoreError* err);
  // send() and recv() (p2p.cc).
  c10::intrusive_ptr<c10d::Work> p2p(bool send, std::vector<at::Tensor>& t, int peer);
  // Every work returned inside a coalescing block is part of the block's work.
  c10::intrusive_ptr<c10d::Work> track(c10::intrusive_ptr<c10d::Work> work) {
    if (coalescing_) coalesced_.push_back(work);
    return work;
  }
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
  bool coalescing_ = false;       // between startCoalescing and endCoalescing
  std::vector<c10::intrusive_ptr<c10d::Work>> coalesced_;
  bool stopped_ = false;
  std::atomic<uint64_t> seq_{0};
  std::atomic<CommlibWork*> spare_{nullptr};  // done_work's, holding one reference
  std::atomic<uint64_t> works_made_{0};
  Completer completer_;
  DeviceCalls devices_{api_};
  std::shared_ptr<P2PHold> hold_;  // shared with its works (which flush it), after completer_
};

// (defined here: both backend.cc and data_movement.cc hand calls over)
template <typename... Args>
c10::intrusive_ptr<c10d::Work> CommlibBackend::delegate(const char* method, Args&&... args) {
  hold_->flush();  // our held messages were issued first
  seq_.fetch_add(1);
  pybind11::gil_scoped_acquire gil;
  pybind11::object work = group_.attr(method)(std::forward<Args>(args)...);
  return track(c10::make_intrusive<PythonWork>(std::move(work)));
}

template <typename Issue>
c10::intrusive_ptr<c10d::Work> CommlibBackend::submit(Issue&& issue, bool async, c10d::OpType type, const char* name,
                                                      const std::vector<at::Tensor>& outputs,
                                                      std::function<void()> finish) {
  hold_->flush();
  if (p2p_handed_over_) flush_held_p2p();
  seq_.fetch_add(1);
  // A future's callback running on the completion thread that issues a call (PowerSGD's hook
  // waits on an all_reduce inside .then) runs it here, or it would wait on its own thread.
  if (async && completer_.on_thread()) async = false;
  std::shared_ptr<commlib::Work> core_work;
  CoreError err;
  // torch's bindings released the GIL before the dispatcher called us: none is held here.
  if (!issue(async, &core_work, &err)) raise_core_error(err, name, getRank());
  if (!async) {
    if (finish) run_finish(finish);
    // (a block's works keep their outputs: endCoalescing builds the block's future from them)
    if (!coalescing_) return done_work(type, name, outputs);
  }
  auto work = c10::make_intrusive<CommlibWork>(api_, type, name, getRank(), outputs, core_work,
                                               async ? std::move(finish) : nullptr);
  if (async) completer_.put(work);
  return track(work);
}

}  // namespace torch_backend
}  // namespace commlib
