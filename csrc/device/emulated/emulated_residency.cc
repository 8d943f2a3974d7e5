// The emulated device's resident blocks across processes (see emulated_residency.h).
#include "device/emulated/emulated_residency.h"

#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <stdexcept>
#include <thread>

#include "common/params.h"
#include "device/shared_ledger.h"

namespace commlib {

namespace {

constexpr unsigned kProcesses = 256;  // processes holding places at once

struct Table {
  struct Holder {
    ProcessId who;
    uint32_t blocks;
  } holders[kProcesses];
};

}  // namespace

std::string emulated_identity(int index) {
  const std::string machine = param_string("COMMLIB_EMULATED_MACHINE");
  return "emulated:" + (machine.empty() ? "" : machine + ":") + std::to_string(index);
}

unsigned mps_client_blocks(unsigned limit) {
  const std::string mps = foreign_env("CUDA_MPS_ACTIVE_THREAD_PERCENTAGE");
  const double pct = mps.empty() ? 0 : std::atof(mps.c_str());
  return pct > 0 && pct < 100 ? static_cast<unsigned>(limit * pct / 100.0) : limit;
}

EmulatedResidency::EmulatedResidency(std::string identity, unsigned limit)
    : ledger_(ledger_name("resident", identity)), limit_(limit), client_limit_(mps_client_blocks(limit)) {}

void EmulatedResidency::enter() {
  const ProcessId me = this_process();
  for (unsigned spins = 0;; ++spins) {
    bool in = false;
    with_shared_ledger(ledger_, sizeof(Table), [&](void* mem) {
      Table& t = *static_cast<Table*>(mem);
      uint64_t resident = 0;
      for (const auto& h : t.holders) resident += h.blocks;
      if (resident >= limit_) {  // full: a dead process's places are free places
        for (auto& h : t.holders)
          if (h.blocks && !(h.who == me) && !process_alive(h.who)) {
            reclaimed_ += h.blocks;
            resident -= h.blocks;
            h = Table::Holder{};
          }
      }
      if (resident >= limit_) return resident == 0;
      Table::Holder* mine = nullptr;
      for (auto& h : t.holders)
        if (h.blocks && h.who == me) mine = &h;
      if (mine && mine->blocks >= client_limit_) return false;  // this process's MPS share is held
      for (auto& h : t.holders)
        if (!mine && !h.blocks) mine = &h;
      if (!mine) throw std::runtime_error(ledger_ + ": more than 256 processes hold resident blocks");
      mine->who = me;
      ++mine->blocks;
      in = true;
      return false;
    });
    if (in) return;
    // As a block the GPU has not scheduled yet: it runs once a resident one returns.
    std::this_thread::sleep_for(std::chrono::microseconds(spins < 100 ? 100 : 1000));
  }
}

void EmulatedResidency::leave() {
  const ProcessId me = this_process();
  with_shared_ledger(ledger_, sizeof(Table), [&](void* mem) {
    Table& t = *static_cast<Table*>(mem);
    bool empty = true;
    for (auto& h : t.holders) {
      if (h.blocks && h.who == me && --h.blocks == 0) h = Table::Holder{};
      if (h.blocks) empty = false;
    }
    return empty;
  });
}

}  // namespace commlib
