// The single-copy read gate (read_gate.h). A file, not a callback: the test's other ranks (other
// processes) see the reader arrive and release it with nothing but the file system.
#include "host/read_gate.h"

#include <fcntl.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <mutex>
#include <thread>

namespace commlib {

namespace {

std::atomic<bool> g_armed{false};
std::mutex g_mu;  // guards the three below
int g_peer = -1;
std::string g_path;
double g_max_wait_s = 0;

}  // namespace

void arm_read_gate(int peer, const std::string& path, double max_wait_s) {
  std::lock_guard<std::mutex> lock(g_mu);
  g_peer = peer;
  g_path = path;
  g_max_wait_s = max_wait_s;
  g_armed.store(!path.empty(), std::memory_order_release);
}

void pass_read_gate(int peer) {
  if (!g_armed.load(std::memory_order_relaxed)) return;
  std::string path;
  double max_wait_s;
  {
    std::lock_guard<std::mutex> lock(g_mu);
    if (!g_armed.load(std::memory_order_relaxed) || peer != g_peer) return;
    g_armed.store(false, std::memory_order_relaxed);  // one read only
    path = g_path;
    max_wait_s = g_max_wait_s;
  }
  int fd = ::open(path.c_str(), O_CREAT | O_WRONLY | O_CLOEXEC, 0600);
  if (fd >= 0) ::close(fd);
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(max_wait_s);
  while (::access(path.c_str(), F_OK) == 0 && std::chrono::steady_clock::now() < deadline)
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
}

}  // namespace commlib
