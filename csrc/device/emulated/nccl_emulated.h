// The emulated NCCL: an implementation of the NcclApi table (device/nccl_loader.h) that the
// emulated device provides (Device::nccl_api()), so CI runs the `nccl` link and algorithm="nccl" without a GPU or libnccl.
//
// It is a test double for NCCL's API *semantics*, not NCCL: grouping (ncclGroupStart/End fuse
// sends and receives into one operation that progresses them together), stream order (every call
// becomes operations on the emulated stream, after what was enqueued before), in-order matching
// per ordered pair of ranks, blocking until the matching operation is posted, and CommAbort
// releasing a stream blocked in a call. Its transfers are host memcpys through memfd regions the
// ranks map from each other (/proc/<pid>/fd), 4 slots of 64 KiB per ordered pair; its collectives
// are grouped sends/receives followed by the shared reduction functors on the stream, reduced in
// rank order (so every rank gets the same bits). Its `void* stream` is the DeviceStream itself.
//
// The unique id names a rendezvous memfd of the rank that called GetUniqueId; CommInitRank blocks
// until all ranks joined (or the configured timeout passes), like ncclCommInitRank.
#pragma once

#include <memory>
#include <string>

#include "device/device.h"
#include "device/nccl_loader.h"

namespace commlib {

const NcclApi& emulated_nccl_api();

// The device (and the set-up timeout) the calling thread's next CommInitRank binds its
// communicator to, as ncclCommInitRank binds to the current CUDA device.
void emulated_nccl_use_device(std::shared_ptr<Device> device, double timeout_s);

// Why the calling thread's last failing call failed (NCCL's codes say little).
std::string emulated_nccl_last_error();

// Tests: from now on CommGetAsyncError of `c` reports `code`, as NCCL does after a network or
// remote failure found in its own threads. Operations in progress are left as they are (they may
// block until CommAbort, as NCCL's may). `api` is the table `c` came from: std::invalid_argument
// unless it is the emulated NCCL's, or without a communicator.
void emulated_nccl_inject_async_error(const NcclApi& api, NcclComm c, NcclResult code);

// Tests: the next sweep of a group of `c` (the host loop that moves a group's chunks) in which a
// send cannot move while a later send of the group goes to the same peer pauses `ms` milliseconds
// right after that send, and again at the sweep's end, as a slow device between two operations:
// the receiver frees slots meanwhile, then acts on what the rest of the sweep published (a group's
// chunks to one peer must still move in order: tests/stream/test_nccl.py). ms 0 arms nothing.
// Returns how many such pauses `c` made so far. std::invalid_argument as for inject_async_error.
int emulated_nccl_pause_sweep(const NcclApi& api, NcclComm c, int ms);

}  // namespace commlib
