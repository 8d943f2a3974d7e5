#include "transport/shm/shm_region.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <string>

#include "common/errors.h"

#ifndef F_GET_SEALS
#define F_GET_SEALS 1034
#define F_SEAL_SHRINK 0x0002
#define F_SEAL_GROW 0x0004
#endif

namespace commlib {

void check_region_fd(int fd, uint64_t expected_bytes) {
  struct stat st;
  if (fstat(fd, &st) != 0) throw CommError(std::string("shm: cannot stat the region descriptor: ") + std::strerror(errno));
  if (!S_ISREG(st.st_mode)) throw CommError("shm: the region descriptor is not a memory file");
  if (st.st_uid != geteuid())
    throw CommError("shm: the region belongs to uid " + std::to_string(st.st_uid) + ", not to this rank's uid " +
                    std::to_string(geteuid()) + "; refusing to map it");
  // Only memfds (and shmem files) carry seals; rank 0 seals the region right after sizing it.
  const int seals = fcntl(fd, F_GET_SEALS);
  if (seals < 0 || (seals & (F_SEAL_SHRINK | F_SEAL_GROW)) != (F_SEAL_SHRINK | F_SEAL_GROW))
    throw CommError("shm: the region is not a memfd sealed against shrinking and growing; refusing to map it");
  char link[128];
  const std::string self = "/proc/self/fd/" + std::to_string(fd);
  const ssize_t n = readlink(self.c_str(), link, sizeof(link) - 1);
  const std::string name = n > 0 ? std::string(link, static_cast<size_t>(n)) : std::string();
  if (name.rfind("/memfd:commlib", 0) != 0)
    throw CommError("shm: the region descriptor is '" + name + "', not a commlib memfd; refusing to map it");
  if (static_cast<uint64_t>(st.st_size) != expected_bytes)
    throw CommError("shm: the region has " + std::to_string(st.st_size) + " bytes but this rank computed " +
                    std::to_string(expected_bytes) +
                    " (COMMLIB_SHM_SLOTS / COMMLIB_SHM_SLOT_BYTES must be the same on every rank)");
}

}  // namespace commlib
