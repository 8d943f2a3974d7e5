// Connecting a stream engine to its peers (see stream_engine.h): the link of every pair
// (stream/device_link.h), the checks of the peers' handles and settings, and the mapping of the
// control regions and inboxes of the peers on this rank's host.
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <sstream>

#include "stream/stream_engine.h"

namespace commlib {

namespace {

// "<pid>:<fd>:<bytes>" fields, strictly parsed (handles come through the store).
std::vector<uint64_t> parse_fields(const std::string& s, size_t n, const std::string& what) {
  std::vector<uint64_t> out;
  std::stringstream ss(s);
  std::string f;
  while (std::getline(ss, f, ':')) {
    if (f.empty() || f.size() > 19 || f.find_first_not_of("0123456789") != std::string::npos) break;
    out.push_back(std::stoull(f));
  }
  if (out.size() != n) throw std::invalid_argument("stream engine: malformed " + what + " '" + s + "'");
  return out;
}

}  // namespace

void StreamEngine::connect(const std::vector<std::string>& handles, const std::vector<int>& host_of) {
  if (static_cast<int>(handles.size()) != size_)
    throw std::invalid_argument("handles: expected " + std::to_string(size_) + ", got " + std::to_string(handles.size()));
  if (static_cast<int>(host_of.size()) != size_)
    throw std::invalid_argument("host_of: expected " + std::to_string(size_) + " hosts, got " +
                                std::to_string(host_of.size()));
  // Links first (stream/device_link.h): ipc across hosts is refused before anything is opened.
  const LinkTopology topo{host_of};
  std::vector<std::unique_ptr<DeviceLink>> links = connect_device_links(topo, rank_, opts_.link);
  DeviceGuard guard(*device_);
  // The kernel path's part ("<mode>:<region>") comes last.
  std::vector<std::string> kernel_handles(size_);
  for (int p = 0; p < size_; ++p) {
    const size_t k = handles[p].rfind(";kernel:");
    if (k == std::string::npos) throw std::invalid_argument("stream engine: malformed handle of rank " + std::to_string(p));
    kernel_handles[p] = handles[p].substr(k + 8);
  }
  check_device_paths(kernel_handles, opts_.path, rank_);
  // Every check of the peers' settings comes before anything of a peer is opened: every rank sees
  // the same handles, so all refuse together, before one of them closes what another would open
  // (a rank that opened first would fail with "cannot open" instead of naming the setting).
  std::vector<std::string> peer_handles(size_);
  std::vector<std::vector<uint64_t>> ctls(size_);
  for (int p = 0; p < size_; ++p) {
    if (p == rank_) continue;
    const std::string h = handles[p].substr(0, handles[p].rfind(";kernel:"));
    const size_t a = h.find(";slots:"), b = h.find(";inbox:");
    if (h.rfind("ctl:", 0) != 0 || a == std::string::npos || b == std::string::npos || b < a)
      throw std::invalid_argument("stream engine: malformed handle of rank " + std::to_string(p));
    ctls[p] = parse_fields(h.substr(4, a - 4), 3, "control handle of rank " + std::to_string(p));
    auto slots = parse_fields(h.substr(a + 7, b - a - 7), 2, "slot settings of rank " + std::to_string(p));
    if (slots[0] != opts_.nslots || slots[1] != opts_.slot_bytes)
      throw std::invalid_argument("COMMLIB_DEVICE_SLOTS/COMMLIB_DEVICE_SLOT_BYTES: rank " + std::to_string(p) + " uses " +
                                  std::to_string(slots[0]) + " x " + std::to_string(slots[1]) + " bytes, rank " +
                                  std::to_string(rank_) + " " + std::to_string(opts_.nslots) + " x " +
                                  std::to_string(opts_.slot_bytes) + "; every rank must use the same");
    if (ctls[p][2] != ctl_bytes()) throw std::invalid_argument("stream engine: rank " + std::to_string(p) + " has another world size");
    peer_handles[p] = h.substr(b + 7);
  }
  // The kernel path checks COMMLIB_DEVICE_LL_BYTES on every handle before it imports anything.
  if (kernel_)
    kernel_->connect(kernel_handles, std::count(host_of.begin(), host_of.end(), host_of[rank_]) == size_);
  for (int p = 0; p < size_; ++p) {
    if (p == rank_ || !topo.same_host(rank_, p)) continue;  // another host: reached over NCCL, nothing of it to map here
    const std::vector<uint64_t>& ctl = ctls[p];
    const std::string path = "/proc/" + std::to_string(ctl[0]) + "/fd/" + std::to_string(ctl[1]);
    int fd = open(path.c_str(), O_RDWR | O_CLOEXEC);
    if (fd < 0) throw std::runtime_error("stream engine: cannot open rank " + std::to_string(p) + "'s control region " + path);
    struct stat st {};
    void* m = MAP_FAILED;
    if (fstat(fd, &st) == 0 && static_cast<uint64_t>(st.st_size) >= ctl[2])
      m = mmap(nullptr, ctl_bytes(), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    ::close(fd);
    if (m == MAP_FAILED) throw std::runtime_error("stream engine: cannot map rank " + std::to_string(p) + "'s control region");
    peers_[p].ctl = static_cast<char*>(m);
    peers_[p].ctl_bytes = ctl_bytes();
    peers_[p].ctl_dev = device_->map_host(m, ctl_bytes());
    peers_[p].inbox = static_cast<char*>(device_->import_memory(peer_handles[p]));
  }
  std::vector<bool> over_nccl(size_);  // the peers NcclLink carries: those not through peer memory
  for (int p = 0; p < size_; ++p) over_nccl[p] = links[p] && !links[p]->through_peer_memory();
  nccl_->set_peers(over_nccl);
  links_ = std::move(links);
  needs_nccl_ = some_pair_uses(topo, opts_.link, "nccl");
  open_remote_staging();
  p2p_probe_ = control_->add_p2p_probe(
      [this](int peer, const CallDesc& want, CallDesc* sent) { return device_message(peer, want, sent); });
  connected_ = true;
}

}  // namespace commlib
