// The device-wide grid budget of the kernel path (issue #38, item 4): the resident blocks of one
// physical device, claimed by every communicator whose kernels may run on it, whichever process
// they belong to. GridBudget (kernel_occupancy.h) divides a device among one communicator's ranks;
// two communicators whose ranks are other processes on the same device (two jobs, two groups of a
// job) each sized themselves to the whole device, and their kernels, each spinning on its peers,
// could hold every place while the other's blocks waited for one: a deadlock until the timeout.
// So every engine claims its grid in a ledger shared by every process using the device
// (device/shared_ledger.h, named by the device's physical id) at set-up:
//  - a claim belongs to a communicator (a key every rank of it computes alike from the handles):
//    the first of its ranks to reach the ledger decides the blocks per rank for all of its ranks on
//    the device, from what other communicators left; the others find that entry and join it. So
//    every rank of a communicator sees the same grant with no second exchange, and a rank also
//    claims on the devices of its peers (the one-sided grid is the least grant of them all);
//  - each process runs one engine's kernel at a time (LaunchChain), so at most the largest grant of
//    a process's engines is resident per process: a communicator on exactly the processes of
//    another's entry does not count that entry, and one whose processes all hold a rank of
//    another's entry (a subgroup beside its parent's engine) may take up to that entry's blocks
//    per rank whatever is left;
//  - the grant is the communicator's share (its own ranks' division, within what a launch can use)
//    or what is left, divided equally; 0 when not even a block per rank is left (the kernel path
//    then refuses, naming the claims, or auto takes the copy path);
//  - an engine releases its claims when it closes (GridClaims' destructor); a dead claimant's are
//    reclaimed by the next claim on the device (its pid and start time no longer run); a
//    communicator refused on one device releases what other devices granted it at once;
//  - COMMLIB_DEVICE_GRID_PERCENT caps a communicator's share of a device (kernel_occupancy.cc), so
//    two jobs can share a GPU's kernel path on purpose rather than by arrival order.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace commlib {

struct GridClaimRequest {
  std::string device;       // the physical id (Device::physical_id)
  unsigned capacity = 0;    // the device's resident blocks of the kernel executor
  uint64_t comm = 0;        // the communicator's key (non-zero)
  unsigned per_rank = 0;    // the blocks each of its ranks on the device would take (its share)
  std::vector<int32_t> pids;  // the processes of its ranks on the device (one per rank)
};

struct GridGrant {
  unsigned per_rank = 0;       // blocks per rank granted (0: none left)
  unsigned claimed_by_others = 0, others = 0;  // what other communicators hold there, and how many
};

// One engine's claims (on every device of its communicator); released when it goes.
class GridClaims {
 public:
  GridClaims() = default;
  GridClaims(const GridClaims&) = delete;
  GridClaims& operator=(const GridClaims&) = delete;
  ~GridClaims();
  GridGrant claim(const GridClaimRequest& r);
  void release();
  // Releases the claims that were granted blocks and keeps those of 0 (a refusal: it holds no
  // block, and keeping it makes the communicator's later ranks refuse alike). For a refusal on one
  // device after grants on others (kernel_occupancy.h's claim_grid).
  void release_granted();

 private:
  struct Held {
    std::string device;
    uint64_t comm;
    unsigned per_rank;  // the grant (0: a refusal)
  };
  // Releases this process's hold of `h` (the entry goes when no process holds it).
  static void release_one(const Held& h);
  std::vector<Held> held_;
};

// This process's claims on a device so far: made (a new entry or joining one), released, refused
// (a grant of 0) and reclaimed (entries of dead processes dropped); and the ledger's entries now
// (communicator key, blocks per rank, ranks, live holders). For the tests' counters.
struct GridClaimCounts {
  uint64_t claims = 0, releases = 0, refused = 0, reclaimed = 0;
};
GridClaimCounts grid_claim_counts(const std::string& device);
struct GridClaimEntry {
  uint64_t comm;
  unsigned per_rank, ranks, holders;
};
std::vector<GridClaimEntry> grid_claim_entries(const std::string& device);
// A random non-zero key (an engine's; rank 0's names its communicator's claims).
uint64_t random_claim_key();
// The ledger's /dev/shm name for a device.
std::string grid_claims_ledger(const std::string& device);

}  // namespace commlib
