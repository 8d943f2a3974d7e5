// Guards against misuse that would otherwise give silently wrong results (docs/security.md):
// buffers that partly overlap, a communicator used in a forked child, and two threads making
// blocking calls on one communicator at once (the check itself lives in Communicator::submit,
// which owns the queue lock; the message is built here).
#pragma once

#include <cstdint>
#include <string>

#include "host/communicator.h"

namespace commlib {

// Bumped in every child process right after fork() (pthread_atfork). A communicator remembers
// the value it was created under; a different one means it is being used in a forked child.
uint64_t fork_generation();

// "" when the call's input and output are disjoint or one of the exact in-place layouts the
// collective supports; else a message naming the arguments (thrown as ValueError).
std::string overlap_problem(const CollectiveCall& call, int rank, int size);

std::string forked_message(int rank, const std::string& label);
std::string concurrent_threads_message(int rank, const std::string& label);

}  // namespace commlib
