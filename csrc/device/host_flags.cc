#include "device/host_flags.h"

#include <linux/futex.h>
#include <sched.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

namespace commlib {

namespace {

uint32_t* low_word(const uint64_t* addr) {
  // Little-endian (x86-64, aarch64): the low half of the counter is its first word.
  return reinterpret_cast<uint32_t*>(const_cast<uint64_t*>(addr));
}

}  // namespace

void store_flag(uint64_t* addr, uint64_t value) {
  reinterpret_cast<std::atomic<uint64_t>*>(addr)->store(value, std::memory_order_release);
  syscall(SYS_futex, low_word(addr), FUTEX_WAKE, 0x7fffffff, nullptr, nullptr, 0);
}

bool wait_flag(const uint64_t* addr, uint64_t value, const std::atomic<bool>* give_up) {
  for (int spin = 0; spin < 64; ++spin) {
    if (load_flag(addr) >= value) return true;
    if (spin >= 16) sched_yield();  // the writer may need this core (ranks share few cores)
  }
  for (;;) {
    const uint64_t seen = load_flag(addr);
    if (seen >= value) return true;
    if (give_up && give_up->load(std::memory_order_acquire)) return false;
    // Bounded sleep: a writer that stored between our load and the futex call changed the word,
    // so FUTEX_WAIT returns at once; the timeout only bounds how late give_up is noticed.
    timespec ts{0, 5 * 1000 * 1000};
    syscall(SYS_futex, low_word(addr), FUTEX_WAIT, static_cast<uint32_t>(seen), &ts, nullptr, 0);
  }
}

}  // namespace commlib
