// Connecting a stream engine to its peers (see stream_engine.h): the link of every pair
// (stream/device_link.h), the checks of the peers' handles and settings, and the mapping of the
// control regions and inboxes of the peers on this rank's host (the copy path's: copy_path.h).
#include <algorithm>

#include "stream/stream_engine.h"

namespace commlib {

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
  std::vector<std::string> peer_inboxes(size_);
  std::vector<std::vector<uint64_t>> ctls(size_);
  for (int p = 0; p < size_; ++p)
    if (p != rank_) ctls[p] = copy_->check_peer_handle(p, handles[p].substr(0, handles[p].rfind(";kernel:")), &peer_inboxes[p]);
  // The kernel path checks COMMLIB_DEVICE_LL_BYTES on every handle before it imports anything.
  if (kernel_)
    kernel_->connect(kernel_handles, std::count(host_of.begin(), host_of.end(), host_of[rank_]) == size_);
  for (int p = 0; p < size_; ++p)  // another host: reached over NCCL, nothing of it to map here
    if (p != rank_ && topo.same_host(rank_, p)) copy_->map_peer(p, ctls[p], peer_inboxes[p]);
  std::vector<bool> over_nccl(size_);  // the peers NcclLink carries: those not through peer memory
  for (int p = 0; p < size_; ++p) over_nccl[p] = links[p] && !links[p]->through_peer_memory();
  nccl_->set_peers(over_nccl);
  std::vector<bool> in_band(size_);  // peers whose call descriptors go over NCCL (remote_descriptors.h)
  for (int p = 0; p < size_; ++p) in_band[p] = links[p] && links[p]->descriptors_in_band();
  copy_->set_links(over_nccl, in_band);
  links_ = std::move(links);
  needs_nccl_ = some_pair_uses(topo, opts_.link, "nccl");
  remote_descs_->open();
  p2p_probe_ = control_->add_p2p_probe(
      [this](int peer, const CallDesc& want, CallDesc* sent) { return p2p_descs_->device_message(peer, want, sent); });
  connected_ = true;
}

int StreamEngine::mapped_peers() const { return copy_->mapped_peers(); }

std::vector<std::string> StreamEngine::link_names() const {
  std::vector<std::string> names(size_);
  for (int p = 0; p < size_; ++p)
    if (links_[p]) names[p] = links_[p]->name();
  return names;
}

}  // namespace commlib
