// The /dev/shm tables several processes share (see shared_ledger.h).
#include "device/shared_ledger.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cctype>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <stdexcept>

namespace commlib {

namespace {

uint64_t start_time_of(int pid) {
  char path[64];
  std::snprintf(path, sizeof path, "/proc/%d/stat", pid);
  FILE* f = std::fopen(path, "re");
  if (!f) return 0;
  char buf[1024];
  const size_t n = std::fread(buf, 1, sizeof buf - 1, f);
  std::fclose(f);
  buf[n] = 0;
  // The command name (field 2) may hold spaces and ')': fields count from after its last ')'.
  const char* p = std::strrchr(buf, ')');
  if (!p) return 0;
  unsigned field = 2;
  for (; *p && field < 22; ++p)
    if (*p == ' ') ++field;
  return std::strtoull(p, nullptr, 10);
}

}  // namespace

ProcessId this_process() {
  static const ProcessId me{static_cast<int32_t>(getpid()), start_time_of(getpid())};
  // A forked child is another process: recompute when the pid moved.
  if (me.pid == getpid()) return me;
  return ProcessId{static_cast<int32_t>(getpid()), start_time_of(getpid())};
}

bool process_alive(const ProcessId& p) {
  if (p.pid <= 0) return false;
  if (kill(p.pid, 0) != 0 && errno == ESRCH) return false;
  const uint64_t start = start_time_of(p.pid);
  return start != 0 && start == p.start;  // a zombie's stat still reads: its entries go when reaped
}

void with_shared_ledger(const std::string& name, size_t bytes, const std::function<bool(void*)>& fn) {
  const std::string path = "/dev/shm/" + name;
  for (;;) {
    const int fd = open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0600);
    if (fd < 0) throw std::runtime_error("cannot open " + path + ": " + std::strerror(errno));
    struct Closer {
      int fd;
      ~Closer() { close(fd); }  // drops the lock too
    } closer{fd};
    while (flock(fd, LOCK_EX) != 0)
      if (errno != EINTR) throw std::runtime_error("cannot lock " + path + ": " + std::strerror(errno));
    struct stat st;
    if (fstat(fd, &st) != 0) throw std::runtime_error("cannot stat " + path + ": " + std::strerror(errno));
    if (st.st_nlink == 0) continue;  // the last user unlinked it while this one waited: open the path again
    if (static_cast<size_t>(st.st_size) < bytes && ftruncate(fd, static_cast<off_t>(bytes)) != 0)
      throw std::runtime_error("cannot size " + path + ": " + std::strerror(errno));
    void* mem = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (mem == MAP_FAILED) throw std::runtime_error("cannot map " + path + ": " + std::strerror(errno));
    bool empty = false;
    try {
      empty = fn(mem);
    } catch (...) {
      munmap(mem, bytes);
      throw;
    }
    munmap(mem, bytes);
    if (empty) unlink(path.c_str());
    return;
  }
}

std::string ledger_name(const std::string& what, const std::string& device) {
  std::string safe;
  for (char c : device) safe += (isalnum(static_cast<unsigned char>(c)) || c == '-' || c == '_') ? c : '.';
  return "commlib-" + what + "-" + std::to_string(getuid()) + "-" + safe;
}

bool shared_ledger_exists(const std::string& name) {
  struct stat st;
  return stat(("/dev/shm/" + name).c_str(), &st) == 0;
}

}  // namespace commlib
