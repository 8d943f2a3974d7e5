// The nccl link and algorithm="nccl" (see stream/nccl_link.h).
#include "stream/nccl_link.h"

#include <sys/mman.h>

#include <algorithm>
#include <stdexcept>

#include "common/errors.h"
#include "device/host_flags.h"

namespace commlib {

namespace {

int nccl_dtype(DType t) {
  switch (t) {
    case DType::Float32: return kNcclFloat32;
    case DType::Float64: return kNcclFloat64;
    case DType::Float16: return kNcclFloat16;
    case DType::BFloat16: return kNcclBfloat16;
    case DType::Int8: return kNcclInt8;
    case DType::UInt8: return kNcclUint8;
    case DType::Int32: return kNcclInt32;
    case DType::Int64: return kNcclInt64;
    default: throw std::invalid_argument("dtype: NCCL has no equivalent");
  }
}

int nccl_op(RedOp op) {
  switch (op) {
    case RedOp::Sum: return kNcclSum;
    case RedOp::Prod: return kNcclProd;
    case RedOp::Max: return kNcclMax;
    case RedOp::Min: return kNcclMin;
    default: throw std::invalid_argument("op: NCCL has no equivalent");
  }
}

}  // namespace

constexpr size_t kMarkBytes = 4096;  // one page: cudaHostRegister maps whole pages anyway
constexpr size_t kLogLength = 256;   // NCCL calls remembered for the watchdog's messages

NcclLink::NcclLink(std::shared_ptr<Device> device, int rank, int size, double timeout_s)
    : device_(std::move(device)), rank_(rank), size_(size), timeout_s_(timeout_s), peers_(size, false) {
  void* m = mmap(nullptr, kMarkBytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (m == MAP_FAILED) throw std::runtime_error("NCCL link: mmap of its stream markers failed");
  marks_ = static_cast<uint64_t*>(m);
  marks_dev_ = device_->map_host(marks_, kMarkBytes);
}

NcclLink::~NcclLink() {
  try {
    close();
  } catch (...) {
  }
  if (marks_) {
    device_->unmap_host(marks_);
    munmap(marks_, kMarkBytes);
  }
}

void NcclLink::enter(const char* what, std::vector<int> peers, DeviceStream& s) {
  const uint64_t n = ++entered_;
  {
    std::lock_guard<std::mutex> lk(log_mu_);
    log_.push_back(Mark{n, what, std::move(peers)});
    if (log_.size() > kLogLength) log_.pop_front();
  }
  device_->write_value(marks_dev_, n, s);
}

void NcclLink::leave(DeviceStream& s) { device_->write_value(marks_dev_ + 1, entered_, s); }

bool NcclLink::inside(std::string* where, uint64_t* entered) {
  const uint64_t in = load_flag(marks_), out = load_flag(marks_ + 1);
  *entered = in;
  if (in <= out) return false;
  std::lock_guard<std::mutex> lk(log_mu_);
  *where = "an NCCL call";
  for (const Mark& m : log_) {
    if (m.n != in) continue;
    *where = m.what;
    if (!m.peers.empty()) {
      *where += m.peers.size() == 1 ? " with rank " : " with ranks ";
      for (size_t i = 0; i < m.peers.size(); ++i) *where += (i ? ", " : "") + std::to_string(m.peers[i]);
    }
  }
  return true;
}

int NcclLink::async_error(std::string* why) {
  std::unique_lock<std::mutex> lk(life_mu_, std::try_to_lock);
  if (!lk.owns_lock()) return 0;  // being destroyed or aborted: the engine knows why
  NcclComm c = comm_.load();
  if (!c || !api_->CommGetAsyncError) return 0;
  NcclResult r = 0;
  if (api_->CommGetAsyncError(c, &r) != 0 || r == 0) return 0;
  *why = std::string(api_->GetErrorString ? api_->GetErrorString(r) : "error") + " (code " + std::to_string(r) +
         ") [" + api_->path + "]";
  return r;
}

void NcclLink::with_comm(const std::function<void(const NcclApi&, NcclComm)>& fn) {
  std::lock_guard<std::mutex> lk(life_mu_);
  if (!api_) throw CommError("NCCL: not loaded");
  fn(*api_, comm_.load());
}

std::string NcclLink::load(const std::vector<std::string>& candidates) {
  std::lock_guard<std::mutex> lk(mu_);
  api_ = device_->nccl_api();
  from_device_ = api_ != nullptr;
  if (!api_) api_ = &load_nccl(candidates);
  return api_->path;
}

bool NcclLink::ready() { return comm_.load() != nullptr && !aborted_.load(); }

void NcclLink::check(NcclResult r, const char* what) {
  if (r == 0) return;
  std::string why = api_->GetErrorString ? api_->GetErrorString(r) : "error";
  if (api_->LastError) why += " (" + api_->LastError() + ")";
  throw CommError(std::string(what) + " failed on rank " + std::to_string(rank_) + ": " + why + " [" + api_->path + "]");
}

std::string NcclLink::unique_id() {
  if (!api_) throw CommError("NCCL: not loaded");
  NcclUniqueId id;
  check(api_->GetUniqueId(&id), "ncclGetUniqueId");
  return std::string(id.internal, sizeof id.internal);
}

void NcclLink::init(const std::string& id) {
  if (!api_) throw CommError("NCCL: not loaded");
  if (id.size() != sizeof(NcclUniqueId::internal))  // from the store: never trust its size
    throw CommError("NCCL unique id: expected " + std::to_string(sizeof(NcclUniqueId::internal)) + " bytes, got " +
                    std::to_string(id.size()));
  NcclUniqueId uid;
  std::copy(id.begin(), id.end(), uid.internal);
  std::lock_guard<std::mutex> lk(mu_);
  if (comm_.load() || aborted_) throw CommError("NCCL: the communicator was already created");
  if (api_->UseDevice) api_->UseDevice(device_, timeout_s_);
  device_->make_current();  // ncclCommInitRank binds the current CUDA device
  NcclComm c = nullptr;
  check(api_->CommInitRank(&c, size_, uid, rank_), "ncclCommInitRank");
  comm_.store(c);
}

void NcclLink::set_peers(const std::vector<bool>& over_nccl) {
  if (static_cast<int>(over_nccl.size()) != size_) throw std::invalid_argument("nccl peers: one flag per rank");
  peers_ = over_nccl;
  peers_[rank_] = false;
  any_ = std::find(peers_.begin(), peers_.end(), true) != peers_.end();
}

char* NcclLink::scratch(size_t bytes, DeviceStream& s) {
  if (bytes > scratch_bytes_) {
    // Stream-ordered (cudaMallocAsync / cudaFreeAsync): calls are ordered on the engine's
    // streams, and neither waits for the device, whose other streams may be parked in waits for
    // peers (cudaFree would synchronise the device here, inside an enqueue: issue #23, item 9).
    if (scratch_) device_->free_ordered(scratch_, s);
    scratch_ = device_->allocate_ordered(bytes, s);
    scratch_bytes_ = bytes;
  }
  return static_cast<char*>(scratch_);
}

void NcclLink::enqueue_step(const Step& step, const std::function<char*(const Region&)>& resolve, size_t esize,
                            DType dtype, RedOp op, DeviceStream& s) {
  struct Reduction {
    char* dst;
    const char* src;  // dst = src op received (src may be dst)
    size_t off, bytes;
  };
  std::vector<Reduction> reductions;
  size_t scratch_need = 0;
  for (const Op& o : step.ops)
    if (o.kind == OpKind::RecvReduce && carries(o.peer)) scratch_need += static_cast<size_t>(o.dst.count) * esize;
  std::lock_guard<std::mutex> lk(mu_);
  if (aborted_) throw CommError("NCCL communicator aborted");
  NcclComm comm = comm_.load();
  if (!comm) throw CommError("NCCL link used before its communicator was created");
  char* scr = scratch_need ? scratch(scratch_need, s) : nullptr;
  const int dt = nccl_dtype(dtype);
  void* stream = s.native_handle();
  std::vector<int> with;
  for (const Op& o : step.ops)
    if (carries(o.peer) && std::find(with.begin(), with.end(), o.peer) == with.end()) with.push_back(o.peer);
  enter("grouped ncclSend/ncclRecv of a schedule step", std::move(with), s);
  check(api_->GroupStart(), "ncclGroupStart");
  size_t used = 0;
  NcclResult r = 0;
  for (const Op& o : step.ops) {
    if (!carries(o.peer) || r) continue;
    if (o.kind == OpKind::Send && o.src.count) {
      r = api_->Send(resolve(o.src), static_cast<size_t>(o.src.count), dt, o.peer, comm, stream);
    } else if ((o.kind == OpKind::Recv || o.kind == OpKind::RecvReduce) && o.dst.count) {
      const size_t bytes = static_cast<size_t>(o.dst.count) * esize;
      char* into = o.kind == OpKind::Recv ? resolve(o.dst) : scr + used;
      if (o.kind == OpKind::RecvReduce) {
        reductions.push_back(Reduction{resolve(o.dst), reduces_from_src(o) ? resolve(o.src) : nullptr, used, bytes});
        used += bytes;
      }
      r = api_->Recv(into, static_cast<size_t>(o.dst.count), dt, o.peer, comm, stream);
    }
  }
  const NcclResult end = api_->GroupEnd();  // always closes the group, even after a failed call
  leave(s);
  check(r, "ncclSend/ncclRecv");
  check(end, "ncclGroupEnd");
  for (const Reduction& red : reductions) {
    if (red.src && red.src != red.dst) device_->copy(red.dst, red.src, red.bytes, s);
    device_->reduce(red.dst, scr + red.off, red.bytes / esize, dtype, op, s);
  }
}

void NcclLink::enqueue_p2p(const std::vector<P2PItem>& items, DType dtype, DeviceStream& s) {
  std::lock_guard<std::mutex> lk(mu_);
  if (aborted_) throw CommError("NCCL communicator aborted");
  NcclComm comm = comm_.load();
  if (!comm) throw CommError("NCCL link used before its communicator was created");
  const int dt = nccl_dtype(dtype);
  void* stream = s.native_handle();
  std::vector<int> with;
  for (const P2PItem& it : items)
    if (carries(it.peer) && std::find(with.begin(), with.end(), it.peer) == with.end()) with.push_back(it.peer);
  enter("grouped ncclSend/ncclRecv (point-to-point)", std::move(with), s);
  check(api_->GroupStart(), "ncclGroupStart");
  NcclResult r = 0;
  for (const P2PItem& it : items) {
    if (!carries(it.peer) || !it.count || r) continue;
    void* p = reinterpret_cast<void*>(it.ptr);
    const size_t n = static_cast<size_t>(it.count);
    r = it.send ? api_->Send(p, n, dt, it.peer, comm, stream) : api_->Recv(p, n, dt, it.peer, comm, stream);
  }
  const NcclResult end = api_->GroupEnd();
  leave(s);
  check(r, "ncclSend/ncclRecv");
  check(end, "ncclGroupEnd");
}

void NcclLink::enqueue_exchange(const std::vector<std::pair<int, const void*>>& sends,
                                const std::vector<std::pair<int, void*>>& recvs, size_t bytes, DeviceStream& s) {
  std::lock_guard<std::mutex> lk(mu_);
  if (aborted_) throw CommError("NCCL communicator aborted");
  NcclComm comm = comm_.load();
  if (!comm) throw CommError("NCCL link used before its communicator was created");
  void* stream = s.native_handle();
  std::vector<int> with;
  for (const auto& sr : sends) with.push_back(sr.first);
  for (const auto& sr : recvs)
    if (std::find(with.begin(), with.end(), sr.first) == with.end()) with.push_back(sr.first);
  enter("ncclSend/ncclRecv of call descriptors", std::move(with), s);
  check(api_->GroupStart(), "ncclGroupStart");
  NcclResult r = 0;
  for (const auto& [peer, p] : sends)
    if (!r) r = api_->Send(p, bytes, kNcclUint8, peer, comm, stream);
  for (const auto& [peer, p] : recvs)
    if (!r) r = api_->Recv(p, bytes, kNcclUint8, peer, comm, stream);
  const NcclResult end = api_->GroupEnd();
  leave(s);
  check(r, "ncclSend/ncclRecv (call descriptors)");
  check(end, "ncclGroupEnd");
}

void NcclLink::check_supported(DType dtype, RedOp op, Collective coll) {
  nccl_dtype(dtype);
  if (coll == Collective::AllReduce || coll == Collective::ReduceScatter || coll == Collective::Reduce) {
    if (op != RedOp::Avg && op != RedOp::PremulSum) nccl_op(op);  // those are scaled around a sum
  }
}

void NcclLink::enqueue_collective(const CollectiveCall& call, const char* in, char* out, RedOp op, DeviceStream& s) {
  std::lock_guard<std::mutex> lk(mu_);
  if (aborted_) throw CommError("NCCL communicator aborted");
  NcclComm comm = comm_.load();
  if (!comm) throw CommError("algorithm='nccl' used before the NCCL communicator was created");
  const int dt = nccl_dtype(call.dtype);
  const size_t n = static_cast<size_t>(call.count), bytes = n * dtype_size(call.dtype);
  void* st = s.native_handle();
  char* src = const_cast<char*>(in);
  std::vector<int> everyone;
  for (int q = 0; q < size_; ++q)
    if (q != rank_) everyone.push_back(q);
  const char* name = nullptr;
  NcclResult r = 0;
  auto call_nccl = [&](const char* what, auto fn) {
    name = what;
    enter(what, everyone, s);
    r = fn();
    leave(s);
  };
  switch (call.coll) {
    case Collective::AllReduce:
      call_nccl("ncclAllReduce", [&] { return api_->AllReduce(in, out, n, dt, nccl_op(op), comm, st); });
      break;
    case Collective::AllGather: call_nccl("ncclAllGather", [&] { return api_->AllGather(in, out, n, dt, comm, st); }); break;
    case Collective::ReduceScatter:
      call_nccl("ncclReduceScatter", [&] { return api_->ReduceScatter(in, out, n, dt, nccl_op(op), comm, st); });
      break;
    case Collective::Broadcast:
      call_nccl("ncclBroadcast", [&] { return api_->Broadcast(in, out, n, dt, call.root, comm, st); });
      break;
    case Collective::Reduce:
      call_nccl("ncclReduce", [&] { return api_->Reduce(in, out ? out : src, n, dt, nccl_op(op), call.root, comm, st); });
      break;
    default: break;
  }
  if (name) return check(r, name);
  // NCCL has no all_to_all, gather or scatter: grouped sends and receives; this rank's own
  // block is a local copy.
  if (!n) return;
  const bool rooted = call.coll != Collective::AllToAll, root = rooted && rank_ == call.root;
  auto block_in = [&](int q) { return call.coll == Collective::Gather ? src : src + q * bytes; };
  auto block_out = [&](int q) { return call.coll == Collective::Scatter ? out : out + q * bytes; };
  const int me = rooted ? call.root : rank_;
  if (!rooted || root) device_->copy(block_out(me), block_in(me), bytes, s);
  std::vector<int> with;
  for (int q : everyone)
    if (!rooted || root || q == call.root) with.push_back(q);
  enter(call.coll == Collective::AllToAll ? "grouped ncclSend/ncclRecv (all_to_all)"
        : call.coll == Collective::Gather ? "grouped ncclSend/ncclRecv (gather)"
                                          : "grouped ncclSend/ncclRecv (scatter)",
        std::move(with), s);
  check(api_->GroupStart(), "ncclGroupStart");
  for (int q = 0; q < size_ && !r; ++q) {
    if (q == rank_) continue;
    const bool sends = call.coll == Collective::AllToAll || (call.coll == Collective::Scatter ? root : q == call.root);
    const bool receives = call.coll == Collective::AllToAll || (call.coll == Collective::Gather ? root : q == call.root);
    if (sends) r = api_->Send(block_in(q), n, dt, q, comm, st);
    if (receives && !r) r = api_->Recv(block_out(q), n, dt, q, comm, st);
  }
  const NcclResult end = api_->GroupEnd();
  leave(s);
  check(r, "ncclSend/ncclRecv");
  check(end, "ncclGroupEnd");
}

void NcclLink::abort() {
  aborted_ = true;
  std::lock_guard<std::mutex> life(life_mu_);  // held only briefly by the watchdog's poll
  NcclComm c = comm_.exchange(nullptr);
  if (c) api_->CommAbort(c);  // a stream (or a host call) blocked in NCCL returns; its data is garbage
}

void NcclLink::close() {
  std::lock_guard<std::mutex> lk(mu_);
  NcclComm c;
  {
    std::lock_guard<std::mutex> life(life_mu_);
    c = comm_.exchange(nullptr);
    if (c) api_->CommDestroy(c);
  }
  if (scratch_) {
    // The engine synchronised its streams: nothing still reads the scratch.
    auto s = device_->create_stream();
    device_->free_ordered(scratch_, *s);
    device_->synchronize(*s);
  }
  scratch_ = nullptr;
  scratch_bytes_ = 0;
}

Launched NcclLink::enqueue(const PathCall& pc, DeviceStream& s) {
  const bool scaled = pc.call.op == RedOp::Avg || pc.call.op == RedOp::PremulSum;
  enqueue_collective(pc.call, pc.bases[0], pc.bases[1], scaled ? RedOp::Sum : pc.call.op, s);
  return Launched{};
}

}  // namespace commlib
