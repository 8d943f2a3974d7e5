// NCCL inside the stream engine (stream/stream_engine.h), two ways:
//  - the `nccl` link: the messages of a schedule step to the peers reached over NCCL become one
//    ncclGroupStart .. ncclSend/ncclRecv .. ncclGroupEnd on the call's stream; a receive that
//    reduces lands in scratch and the shared reduction functors run on the stream after the
//    group. NCCL messages carry no header: the engine's descriptor check (control plane) runs
//    before any of them, as for the ipc link. Zero-byte messages are skipped on both sides
//    (NCCL moves its data itself, so they order nothing here).
//  - algorithm="nccl": the whole collective is NCCL's own (AllReduce, AllGather, ReduceScatter,
//    Broadcast, Reduce; all_to_all, gather and scatter as grouped sends/receives, as torch's
//    NCCL process group does), for comparison with our schedules in the same job.
// The communicator is created lazily (the first call that needs it, commlib/device/nccl_comm.py): rank
// 0's unique id goes through the store (exactly 128 bytes), every rank calls init(). abort() is
// ncclCommAbort, called when the engine fails, so a stream blocked in NCCL is released; close()
// is ncclCommDestroy once the engine's calls have drained.
// The table is the one the device provides (Device::nccl_api(): the emulated device's is the
// emulated NCCL, device/emulated/nccl_emulated.h), else libnccl.
#pragma once

#include <atomic>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "device/device.h"
#include "device/nccl_loader.h"
#include "plan/call.h"
#include "plan/describe.h"
#include "schedule/ir.h"
#include "stream/device_path.h"

namespace commlib {

class NcclLink final : public DevicePathRunner {
 public:
  NcclLink(std::shared_ptr<Device> device, int rank, int size, double timeout_s);
  ~NcclLink() override;

  // Chooses the NCCL: the device's own (Device::nccl_api()), else the first of `candidates` that
  // loads (device/nccl_loader.h). Returns the library's description.
  std::string load(const std::vector<std::string>& candidates);
  bool from_device() const { return from_device_; }
  bool ready();
  std::string unique_id();              // ncclGetUniqueId: 128 bytes (rank 0)
  void init(const std::string& id);     // ncclCommInitRank: blocks until every rank joined

  // Which peers the link carries: those whose device link (stream/device_link.h) is nccl; the rest
  // use the engine's peer memory.
  void set_peers(const std::vector<bool>& over_nccl);
  bool carries(int peer) const { return peer >= 0 && peer < size_ && peers_[peer]; }
  bool carries_any() const { return any_; }

  // The messages of `step` to carried peers, as one group on `s` (see above).
  void enqueue_step(const Step& step, const std::function<char*(const Region&)>& resolve, size_t esize,
                    DType dtype, RedOp op, DeviceStream& s);
  // Point-to-point messages (send / recv / batches, all_to_all with splits) to carried peers, as
  // one group on `s`; zero-count ones are skipped on both sides.
  void enqueue_p2p(const std::vector<P2PItem>& items, DType dtype, DeviceStream& s);
  // One group of `bytes`-byte messages: to each (peer, device address) of `sends`, from each of
  // `recvs`. The engine's call descriptors for peers on other hosts (stream/remote_descriptors.*).
  void enqueue_exchange(const std::vector<std::pair<int, const void*>>& sends,
                        const std::vector<std::pair<int, void*>>& recvs, size_t bytes, DeviceStream& s);
  // algorithm="nccl". `op` is what NCCL reduces with (Sum for avg / premul_sum: the engine
  // scales and divides around it). Throws std::invalid_argument for what NCCL lacks.
  void enqueue_collective(const CollectiveCall& call, const char* in, char* out, RedOp op, DeviceStream& s);
  // algorithm="nccl" as a device path (DevicePathRunner): the call's input (or its private copy)
  // and output to enqueue_collective, NCCL summing what avg and premul_sum scale around it.
  Launched enqueue(const PathCall& call, DeviceStream& s) override;
  static void check_supported(DType dtype, RedOp op, Collective coll);

  void abort();  // any thread
  void close();  // after the engine's streams drained

  // The watchdog's view (any thread, never blocks): ncclCommGetAsyncError (0: none, or no
  // communicator), with NCCL's description in *why; and whether the stream is inside an NCCL
  // call now, described in *where ("ncclAllReduce with ranks 1, 2"), with the number of NCCL
  // calls it entered so far (progress) in *entered.
  int async_error(std::string* why);
  bool inside(std::string* where, uint64_t* entered);
  // Runs `fn` on the table and the communicator (null: none yet, or destroyed), which stays alive
  // meanwhile (a test double's hooks, e.g. emulated_nccl_inject_async_error).
  void with_comm(const std::function<void(const NcclApi&, NcclComm)>& fn);

 private:
  void check(NcclResult r, const char* what);
  // Marks an NCCL call on the stream: `entered` is written before it, `left` after it, so the
  // watchdog sees where the stream is blocked (the call and its peers, logged here).
  void enter(const char* what, std::vector<int> peers, DeviceStream& s);
  void leave(DeviceStream& s);
  char* scratch(size_t bytes, DeviceStream& s);

  std::shared_ptr<Device> device_;
  const int rank_, size_;
  const double timeout_s_;
  const NcclApi* api_ = nullptr;
  bool from_device_ = false;  // the device's own table, not libnccl
  std::vector<bool> peers_;
  bool any_ = false;

  // Enqueues, init and close take mu_; abort (the watchdog) does not: an enqueue may be blocked
  // on the host inside NCCL (ncclGroupEnd connecting to a dead peer), and ncclCommAbort from
  // another thread is what releases it.
  std::mutex mu_;
  std::atomic<NcclComm> comm_{nullptr};
  std::atomic<bool> aborted_{false};
  void* scratch_ = nullptr;
  size_t scratch_bytes_ = 0;

  // Stream position markers: [0] NCCL calls entered, [1] left (host memory mapped for the device).
  uint64_t* marks_ = nullptr;
  uint64_t* marks_dev_ = nullptr;
  uint64_t entered_ = 0;  // enqueue side
  struct Mark {
    uint64_t n;
    const char* what;
    std::vector<int> peers;
  };
  std::mutex log_mu_;
  std::deque<Mark> log_;  // the last NCCL calls enqueued
  // Held while ncclCommGetAsyncError or ncclCommDestroy/Abort uses the communicator, so the
  // watchdog's poll never reads a destroyed one.
  std::mutex life_mu_;
};

}  // namespace commlib
