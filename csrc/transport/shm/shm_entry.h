// The shm kind's material for the transport table (transport/registry.h): this host's region.
#pragma once

#include "transport/registry.h"

namespace commlib {

constexpr const char* kShmKind = "shm";

// This host's shared-memory region (a memfd, sized and laid out for exactly the host's ranks by
// commlib/init.py); handed to the table under kShmKind. The shm domain maps it; the caller keeps
// the fd.
struct ShmRegion : TransportMaterial {
  explicit ShmRegion(int fd_) : fd(fd_) {}
  int fd = -1;
};

}  // namespace commlib
