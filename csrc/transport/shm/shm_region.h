// Checks on the shared-memory region a rank is about to map. The descriptor came from another
// process, so before mapping it we make sure it is what rank 0 was supposed to create: a memfd
// made by commlib, owned by our user, of exactly the size this rank computed, and sealed so that no
// process can shrink it under our mapping (a shrunk shared mapping kills every rank with SIGBUS).
#pragma once

#include <cstdint>

namespace commlib {

// Throws CommError naming the first check that fails.
void check_region_fd(int fd, uint64_t expected_bytes);

}  // namespace commlib
