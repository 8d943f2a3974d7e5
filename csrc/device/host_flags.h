// 64-bit counters in memory shared between processes, written and awaited from host threads: the
// emulated device's write_value / wait_value, and the stream engine's release of a stuck stream
// (it raises the counters a stream waits on). Waiters spin briefly, then sleep on a futex on the
// counter's low 32 bits (counters only grow, so a write always changes them) with a short
// timeout, so a missed wake-up costs at most that timeout.
#pragma once

#include <atomic>
#include <cstdint>

namespace commlib {

// *addr = value (release) and wake every waiter on it, in any process.
void store_flag(uint64_t* addr, uint64_t value);

inline uint64_t load_flag(const uint64_t* addr) {
  return reinterpret_cast<const std::atomic<uint64_t>*>(addr)->load(std::memory_order_acquire);
}

// Waits until *addr >= value. Returns false (without waiting further) once *give_up is true.
bool wait_flag(const uint64_t* addr, uint64_t value, const std::atomic<bool>* give_up);

}  // namespace commlib
