// The emulated device's resident blocks, shared by every process using the device (issue #38,
// item 4), as a GPU's SMs are: COMMLIB_EMULATED_RESIDENT_BLOCKS places on the device, whichever
// process's kernel asks. A block of the kernel executor takes a place before it runs and gives it
// back when it returns; while the device holds the limit it waits (polling: a block that waits
// here is what a GPU leaves unscheduled). The places live in a shared ledger (device/shared_ledger.h)
// named by the device's identity: this user, COMMLIB_EMULATED_MACHINE (the machine the emulated
// devices belong to: tests give each pool its own, so that concurrent test runs do not share a
// device) and the index. Each process's places are counted under its (pid, start time): a dead
// process's places are reclaimed by the next block that finds the device full. The ledger is
// unlinked whenever no block is resident. As an MPS client's, a process's own blocks are limited to
// CUDA_MPS_ACTIVE_THREAD_PERCENTAGE of the places where that is set (read when the device is made):
// its further blocks wait for one of its own to return, whatever the device has free.
#pragma once

#include <cstdint>
#include <string>

namespace commlib {

class EmulatedResidency {
 public:
  EmulatedResidency(std::string identity, unsigned limit);
  // A block takes a place (waits while `limit` blocks of any process are resident) / gives it back.
  void enter();
  void leave();
  unsigned limit() const { return limit_; }
  // This process's places at most (the limit, or its MPS share of it).
  unsigned client_limit() const { return client_limit_; }
  // The ledger's /dev/shm name.
  const std::string& ledger() const { return ledger_; }
  // Places of dead processes reclaimed by this process so far (tests).
  uint64_t reclaimed() const { return reclaimed_; }

 private:
  const std::string ledger_;
  const unsigned limit_;
  const unsigned client_limit_;
  uint64_t reclaimed_ = 0;
};

// "emulated:<machine>:<index>" (COMMLIB_EMULATED_MACHINE; "emulated:<index>" when unset): the
// identity processes share an emulated device by (its physical id).
std::string emulated_identity(int index);
// The places of `limit` a process may hold under CUDA_MPS_ACTIVE_THREAD_PERCENTAGE (the limit where
// it is unset or not in (0, 100)), as stream/kernel_occupancy.cc's residency_of computes a GPU's.
unsigned mps_client_blocks(unsigned limit);

}  // namespace commlib
