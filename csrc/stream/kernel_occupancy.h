// The kernel path's grid beside the other ranks' (issue #38, item 4). The executor's blocks spin on
// each other (grid barriers, split items) and on the peers' blocks, so every block of every rank
// sharing a device must be resident at once, beside whatever else the device holds: a block left
// waiting for a place is waited on by a resident one, and neither ever moves (a hang until the
// watchdog's timeout). So:
//  - at set-up every rank puts its device's residency (Device::plan_residency: the blocks the
//    device holds, the blocks this process may hold under MPS) and the device's physical identity
//    into its handle; every rank then computes the same budget for every rank: the device's blocks
//    divided among the ranks sharing it, capped by each process's own limit. Launches use at most
//    the budget (the grid is sized to fit); a budget of 0 for some rank refuses the kernel path on
//    every rank (COMMLIB_DEVICE_PATH=kernel raises, auto takes the copy path), naming why.
//  - that budget is one communicator's view: every engine then claims its grid in the device-wide
//    budget every process using the device shares (claim_grid, grid_claims.h), so communicators
//    whose ranks are other processes on the same device (two jobs) hold disjoint places: the
//    later one sizes itself to what is left, or refuses naming the claims;
//  - two engines (communicators) of one process on one device never run their kernels at once
//    (LaunchChain): each launch waits for the previous kernel-path launch of the other engines of
//    the device, so the grids never share the device's places (and the claims of communicators
//    on the same processes do not count against each other). Ranks whose processes enqueue two
//    communicators' collectives in different orders still deadlock (as with NCCL): the order of
//    calls across communicators must agree.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "device/device.h"
#include "stream/grid_claims.h"

namespace commlib {

// The device's residency with MPS's share applied where it is an MPS client.
Device::Residency residency_of(const Device& d);
// "<device blocks>.<client blocks>.<SMs>.<max launch>.<pid>.<nonce, hex>.<grid percent>.<physical id, hex>"
// (no ',' or ':': a field of the kernel handle): `max_launch`, the most blocks a launch of this rank
// takes; `nonce`, this engine's random key (rank 0's names the communicator's claims: grid_claims.h);
// `grid_percent`, COMMLIB_DEVICE_GRID_PERCENT: the share of a device's resident blocks the
// communicator's ranks on it may claim together (the same on every rank).
std::string residency_field(const Device& d, unsigned max_launch, uint64_t nonce, unsigned grid_percent);

struct GridBudget {
  unsigned blocks = 0;  // per launch of this rank; 0 with fits: no limit known
  // A one-sided launch's grid at most, the same on every rank (its flags are per block): the least
  // over the ranks of the device's SM count (Device::multiprocessors; 16 where unknown) and the
  // rank's share of resident blocks, within `max_grid`.
  unsigned one_sided = 1;
  bool fits = true;     // every rank has at least one block
  std::string why;      // when it does not fit: which rank, which device, what the limits were
};
// The budget of rank `rank` from every rank's residency_field (those on this host, `same_host`).
// Throws std::invalid_argument naming COMMLIB_DEVICE_GRID_PERCENT when the ranks' caps differ or
// the cap leaves some rank less than one block (on every rank alike: the fields are the same).
GridBudget grid_budget(const std::vector<std::string>& fields, const std::vector<bool>& same_host, int rank,
                       unsigned max_grid);

// The device-wide budget (grid_claims.h): claims, on every device of this host's ranks with a known
// limit, what `budget` (grid_budget's) gives each rank there, or what other communicators left;
// `budget` then holds the grants (blocks: this rank's device's; one_sided: within every device's),
// or fits false with why (which device, what the others claimed) when some device has not a block
// per rank left; then the blocks granted on the other devices are released at once (the refusal
// stays held until the engine closes, so the communicator's later ranks refuse alike). The same on
// every rank.
void claim_grid(const std::vector<std::string>& fields, const std::vector<bool>& same_host, int rank,
                GridBudget& budget, GridClaims& claims);

// Kernel-path launches of one process on one device, one at a time across engines (see above).
class LaunchChain {
 public:
  static std::shared_ptr<LaunchChain> of(Device& d);  // the process's chain of `d`
  // Enqueues a launch (`launch`) on `stream` for the engine `owner`: first makes `stream` wait for
  // the device's last launch by another engine, then records `mine` after it as the device's last
  // launch; all of it under one lock, so two engines enqueueing at once are ordered too. While only
  // one engine of the device lives, neither (no call more than before).
  void run(Device& d, DeviceStream& stream, const void* owner, const std::shared_ptr<DeviceEvent>& mine,
           const std::function<void()>& launch);
  void join();
  void leave(const void* owner);

 private:
  std::mutex mu_;
  int engines_ = 0;
  const void* last_owner_ = nullptr;
  std::shared_ptr<DeviceEvent> last_;
};

}  // namespace commlib
