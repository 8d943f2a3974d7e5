// The emulated device's memory: allocations, stream-ordered frees and the IPC rules of export and
// import (an importer of its own export refused, a free under a peer's mapping counted). Split from
// emulated_device.cc, which keeps kernels and faults (streams: emulated_stream.cc, events:
// emulated_events.cc).
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <memory>
#include <mutex>
#include <vector>
#include <cstring>
#include <stdexcept>
#include <string>

#include "device/emulated/emulated_device.h"
#include "device/emulated/emulated_rules.h"

namespace commlib {

namespace {

EmulatedStream& emu(DeviceStream& s) { return static_cast<EmulatedStream&>(s); }

constexpr size_t kPage = 4096;

// An allocation's last page holds the count of importers mapping it (the IPC rule's witness).
std::atomic<uint64_t>& import_count(void* base, size_t mapped) {
  return *reinterpret_cast<std::atomic<uint64_t>*>(static_cast<char*>(base) + mapped - kPage);
}

// Strict parse of an unsigned decimal field of an IPC handle (handles come through the store).
uint64_t parse_field(const std::string& s, const std::string& handle) {
  if (s.empty() || s.size() > 19 || s.find_first_not_of("0123456789") != std::string::npos)
    throw std::invalid_argument("emulated device: malformed memory handle '" + handle + "'");
  return std::stoull(s);
}

}  // namespace

void* EmulatedDevice::allocate(size_t bytes) {
  enter("cudaMalloc", false, true);  // not stream-ordered: a capture may prohibit it
  if (oom_next_.exchange(false, std::memory_order_acq_rel))
    throw std::runtime_error("cudaErrorMemoryAllocation (emulated, injected on " + name() + "): out of memory");
  return allocate_memory(bytes);
}

void* EmulatedDevice::allocate_ordered(size_t bytes, DeviceStream& stream) {
  enter("cudaMallocAsync");
  if (emu(stream).capture())
    throw std::runtime_error("emulated device: cudaMallocAsync on a capturing stream (a graph memory node) is not "
                             "modelled; allocate before the capture");
  return allocate_memory(bytes, false);
}

void* EmulatedDevice::allocate_with(size_t bytes, void* at, bool shareable) {
  enter("cudaMalloc", false, true);
  return allocate_memory(bytes, shareable, at);
}

Device::MemoryRange EmulatedDevice::memory_range(const void* ptr) {
  enter("cuPointerGetAttributes");
  return range_of(ptr);
}

Device::MemoryRange EmulatedDevice::range_of(const void* ptr) {
  std::lock_guard<std::mutex> lk(mu_);
  auto it = allocations_.upper_bound(const_cast<void*>(ptr));
  if (it == allocations_.begin()) return MemoryRange{};
  --it;
  char* base = static_cast<char*>(it->first);
  const size_t usable = it->second.bytes - kPage;  // the count page is the emulation's own
  if (static_cast<const char*>(ptr) >= base + usable) return MemoryRange{};
  return MemoryRange{base, usable, it->second.buffer_id, it->second.shareable};
}

void* EmulatedDevice::allocate_memory(size_t bytes, bool shareable, void* at) {
  const size_t size = ((bytes ? bytes : 1) + kPage - 1) / kPage * kPage + kPage;  // + the count page
  int fd = memfd_create("commlib-emulated", MFD_CLOEXEC);
  if (fd < 0) throw std::runtime_error(std::string("emulated device: memfd_create: ") + std::strerror(errno));
  if (ftruncate(fd, static_cast<off_t>(size)) != 0) {
    const int err = errno;
    close(fd);
    throw std::runtime_error(std::string("emulated device: cannot allocate ") + std::to_string(bytes) +
                             " bytes: " + std::strerror(err));
  }
  void* p = mmap(at, size, PROT_READ | PROT_WRITE, MAP_SHARED | (at ? MAP_FIXED_NOREPLACE : 0), fd, 0);
  if (p == MAP_FAILED || (at && p != at)) {
    const int err = errno;
    if (p != MAP_FAILED) munmap(p, size);  // a kernel without MAP_FIXED_NOREPLACE took it as a hint
    close(fd);
    throw std::runtime_error(std::string("emulated device: mmap") + (at ? " at the address asked for" : "") + ": " +
                             std::strerror(err));
  }
  std::lock_guard<std::mutex> lk(mu_);
  allocations_[p] = Allocation{fd, size, next_buffer_id_++, shareable};
  return p;
}

void EmulatedDevice::release(void* ptr) {
  Allocation a;
  {
    std::lock_guard<std::mutex> lk(mu_);
    auto it = allocations_.find(ptr);
    if (it == allocations_.end()) return;
    a = it->second;
    allocations_.erase(it);
  }
  // CUDA IPC: memory must not be freed while a peer maps it (the peer reads freed, maybe reused,
  // memory). Counted, then freed (the memfd lives on in the peer's mapping).
  if (const uint64_t n = import_count(ptr, a.bytes).load(std::memory_order_acquire))
    emulated_count_mapped_export_free("cudaFree on " + name() + " of exported memory that " + std::to_string(n) +
                                      " importer(s) still map (close the imports first)");
  munmap(ptr, a.bytes);
  close(a.fd);
}

void EmulatedDevice::free_async(void* ptr, DeviceStream& stream) {
  if (!ptr) return;
  enter("cudaFree", false, true);
  // cudaFree synchronises the device: the host waits for every stream of it, a stream parked in
  // a wait for a peer included (inside an enqueue that is a stall, or a deadlock when that peer
  // waits for this host). Counted when some stream still had work, then done as CUDA does.
  std::vector<std::shared_ptr<EmulatedStream>> live;
  {
    std::lock_guard<std::mutex> lk(mu_);
    for (auto& w : streams_)
      if (auto st = w.lock()) live.push_back(std::move(st));
  }
  bool busy = emu(stream).busy();
  for (auto& st : live) busy = busy || st->busy();
  if (busy) emulated_count_busy_free("cudaFree on " + name() + " while its streams had unfinished work");
  emu(stream).synchronize();
  for (auto& st : live) st->synchronize();
  enter("cudaFree");
  release(ptr);
}

void EmulatedDevice::free_ordered(void* ptr, DeviceStream& stream) {
  if (!ptr) return;
  enter("cudaFreeAsync");
  if (emu(stream).capture())
    throw std::runtime_error("emulated device: cudaFreeAsync on a capturing stream (a graph memory node) is not "
                             "modelled; free after the capture");
  emu(stream).enqueue([this, ptr] { release(ptr); });
}

size_t EmulatedDevice::allocated_bytes() {
  std::lock_guard<std::mutex> lk(mu_);
  size_t n = 0;
  for (auto& kv : allocations_) n += kv.second.bytes;
  return n;
}

std::string EmulatedDevice::export_memory(void* ptr) {
  enter("cudaIpcGetMemHandle");
  std::lock_guard<std::mutex> lk(mu_);
  auto it = allocations_.find(ptr);
  if (it == allocations_.end()) throw std::invalid_argument("export_memory: not the start of an emulated allocation");
  if (!it->second.shareable)  // cudaIpcGetMemHandle on VMM or pool memory: cudaErrorInvalidValue
    throw std::invalid_argument("export_memory: cudaErrorInvalidValue (emulated): this allocation has no shareable "
                                "handle (not cudaMalloc'd memory)");
  return "emu:" + std::to_string(getpid()) + ":" + std::to_string(it->second.fd) + ":" +
         std::to_string(it->second.bytes);
}

void* EmulatedDevice::import_memory(const std::string& handle) {
  // "emu:<pid>:<fd>:<bytes>"
  if (handle.rfind("emu:", 0) != 0) throw std::invalid_argument("emulated device: malformed memory handle '" + handle + "'");
  std::string rest = handle.substr(4);
  size_t a = rest.find(':'), b = a == std::string::npos ? a : rest.find(':', a + 1);
  if (b == std::string::npos) throw std::invalid_argument("emulated device: malformed memory handle '" + handle + "'");
  const uint64_t pid = parse_field(rest.substr(0, a), handle);
  enter("cudaIpcOpenMemHandle", false, true);
  if (pid == static_cast<uint64_t>(getpid()))  // CUDA IPC refuses a handle of one's own process
    throw std::invalid_argument("emulated device: cannot import memory exported by this process (" + handle +
                                "): CUDA IPC refuses it; use the pointer itself");
  const uint64_t fd = parse_field(rest.substr(a + 1, b - a - 1), handle);
  const uint64_t bytes = parse_field(rest.substr(b + 1), handle);
  const std::string path = "/proc/" + std::to_string(pid) + "/fd/" + std::to_string(fd);
  int f = open(path.c_str(), O_RDWR | O_CLOEXEC);
  if (f < 0) throw std::runtime_error("emulated device: cannot open peer memory " + path + ": " + std::strerror(errno));
  struct stat st {};
  if (fstat(f, &st) != 0 || static_cast<uint64_t>(st.st_size) < bytes || bytes == 0) {
    close(f);
    throw std::runtime_error("emulated device: peer memory " + path + " is smaller than its handle says");
  }
  if (bytes % kPage) {
    close(f);
    throw std::invalid_argument("emulated device: malformed memory handle '" + handle + "' (size)");
  }
  void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, f, 0);
  const int err = errno;
  close(f);
  if (p == MAP_FAILED) throw std::runtime_error(std::string("emulated device: mmap of peer memory: ") + std::strerror(err));
  import_count(p, bytes).fetch_add(1, std::memory_order_acq_rel);
  std::lock_guard<std::mutex> lk(mu_);
  imports_[p] = bytes;
  return p;
}

size_t EmulatedDevice::imported_bytes(void* ptr) {
  enter("cuPointerGetAttributes");
  std::lock_guard<std::mutex> lk(mu_);
  auto it = imports_.find(ptr);
  return it == imports_.end() ? 0 : it->second - kPage;  // (the count page is the emulation's own)
}

void EmulatedDevice::close_import(void* ptr) {
  enter("cudaIpcCloseMemHandle", false, true);
  size_t bytes = 0;
  {
    std::lock_guard<std::mutex> lk(mu_);
    auto it = imports_.find(ptr);
    if (it == imports_.end()) return;
    bytes = it->second;
    imports_.erase(it);
  }
  import_count(ptr, bytes).fetch_sub(1, std::memory_order_acq_rel);
  munmap(ptr, bytes);
}

}  // namespace commlib
