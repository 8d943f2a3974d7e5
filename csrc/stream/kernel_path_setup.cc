// The kernel path's set-up beyond its region (see kernel_path.h): the peer buffers' tables
// (device/peer_buffers.h) and the grid's budget (stream/kernel_occupancy.h) travel in its handle;
// launches are sized to the budget and go through the device's LaunchChain.
#include <algorithm>
#include <climits>
#include <functional>
#include <stdexcept>

#include "common/params.h"
#include "kernels/plan_kernel.cuh"
#include "stream/kernel_path.h"

namespace commlib {

std::string KernelPath::setup_fields() const {
  // The most blocks a launch of this rank takes: a message plan's, or a one-sided plan's (a block
  // per SM, kernel_path_one_sided.cc), before any budget.
  const unsigned sms = device_->multiprocessors();
  const unsigned max_launch =
      std::max(device_->plan_blocks(kexec::kMaxBlocks), std::min(sms ? sms : kexec::kMaxBlocks, kexec::kMaxGrid));
  // The communicator's cap on its claim (COMMLIB_DEVICE_GRID_PERCENT, kernel_occupancy.h), read when
  // its engine is made.
  const auto percent = static_cast<unsigned>(param_int("COMMLIB_DEVICE_GRID_PERCENT"));
  return "," + peer_buffers_->local_handle() + "," + residency_field(*device_, max_launch, claim_nonce_, percent);
}

void KernelPath::connect_setup(const std::vector<std::string>& peer_tables, const std::vector<std::string>& residencies,
                               bool one_host) {
  const std::vector<bool> here(size_, one_host);
  if (usable_) {
    GridBudget b = commlib::grid_budget(residencies, here, rank_, kexec::kMaxGrid);  // the same on every rank
    claim_grid(residencies, here, rank_, b, claims_);  // beside other communicators on the devices (grid_claims.h)
    if (!b.fits) {
      if (mode_ == DevicePath::Kernel)
        throw std::invalid_argument("COMMLIB_DEVICE_PATH=kernel: " + b.why +
                                    "; give the ranks devices of their own, raise the limit, or use "
                                    "COMMLIB_DEVICE_PATH=auto (the copy path)");
      usable_ = false;  // auto: every call takes the copy path
    }
    grid_budget_ = b.blocks;
    one_sided_grid_ = b.one_sided;
  }
  peer_buffers_->connect(peer_tables, std::vector<bool>(size_, usable_));
}

unsigned KernelPath::launch_blocks(unsigned wanted) const {
  const unsigned blocks = device_->plan_blocks(wanted);
  return grid_budget_ ? std::max(1u, std::min(blocks, grid_budget_)) : blocks;
}

void KernelPath::launch_in_chain(const kexec::PlanLaunch& a, unsigned blocks, DType dtype, RedOp op, bool reduces,
                                 DeviceStream& stream, bool captured) {
  auto launch = [&] { device_->launch_plan(a, blocks, dtype, op, reduces, stream); };
  // A capture may not wait on an event recorded outside it (cudaErrorStreamCaptureIsolation): a
  // captured launch is ordered by the caller's streams, as replays are (docs/gpu.md).
  if (captured || !chain_) return launch();
  // By reference: the lambda's captures would not fit std::function's inline buffer, and a hit
  // allocates nothing (tests/stream/test_call_counts.py).
  chain_->run(*device_, stream, this, chain_event_, std::function<void()>(std::ref(launch)));
}

}  // namespace commlib
