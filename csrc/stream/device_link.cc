// The device links' table and the choice per pair (see device_link.h).
#include "stream/device_link.h"

#include <algorithm>
#include <stdexcept>

#include "common/params.h"

namespace commlib {

namespace {

class PeerMemoryLink final : public DeviceLink {
 public:
  const char* name() const override { return "ipc"; }
  bool through_peer_memory() const override { return true; }
  bool descriptors_in_band() const override { return false; }
};

class NcclPeerLink final : public DeviceLink {
 public:
  explicit NcclPeerLink(bool other_host) : other_host_(other_host) {}
  const char* name() const override { return "nccl"; }
  bool through_peer_memory() const override { return false; }
  bool descriptors_in_band() const override { return other_host_; }

 private:
  const bool other_host_;  // no control region of the peer is mapped here
};

bool ipc_can_connect(const LinkTopology& topo, int a, int b, DeviceLinkSetting setting) {
  return setting != DeviceLinkSetting::Nccl && topo.same_host(a, b);
}

std::unique_ptr<DeviceLink> create_ipc(const LinkTopology&, int, int) { return std::make_unique<PeerMemoryLink>(); }

bool nccl_can_connect(const LinkTopology&, int, int, DeviceLinkSetting setting) {
  return setting != DeviceLinkSetting::Ipc;
}

std::unique_ptr<DeviceLink> create_nccl(const LinkTopology& topo, int me, int peer) {
  return std::make_unique<NcclPeerLink>(!topo.same_host(me, peer));
}

void check_rank(const LinkTopology& topo, int r) {
  if (r < 0 || r >= topo.size())
    throw std::invalid_argument("rank: " + std::to_string(r) + " is not a rank of the host map (size " +
                                std::to_string(topo.size()) + ")");
}

}  // namespace

DeviceLinkSetting parse_device_link_setting(const std::string& value) {
  const std::string v = parse_choice("COMMLIB_DEVICE_LINK", value, {"auto", "ipc", "nccl"});
  return v == "ipc" ? DeviceLinkSetting::Ipc : v == "nccl" ? DeviceLinkSetting::Nccl : DeviceLinkSetting::Auto;
}

DeviceLinkSetting device_link_setting_from_env() {
  return parse_device_link_setting(param_string("COMMLIB_DEVICE_LINK"));
}

const char* device_link_setting_name(DeviceLinkSetting s) {
  return s == DeviceLinkSetting::Auto ? "auto" : s == DeviceLinkSetting::Ipc ? "ipc" : "nccl";
}

const std::vector<DeviceLinkKind>& device_link_kinds() {
  static const std::vector<DeviceLinkKind> kinds = {
      {"ipc", ipc_can_connect, create_ipc},
      {"nccl", nccl_can_connect, create_nccl},
  };
  return kinds;
}

const DeviceLinkKind& choose_device_link(const LinkTopology& topo, int a, int b, DeviceLinkSetting setting) {
  check_rank(topo, a);
  check_rank(topo, b);
  for (const DeviceLinkKind& k : device_link_kinds())
    if (k.can_connect(topo, a, b, setting)) return k;
  // Only ipc across hosts gets here: the table has no other way to refuse a pair.
  throw std::invalid_argument("COMMLIB_DEVICE_LINK: rank " + std::to_string(b) + " is on another host than rank " +
                              std::to_string(a) + ", and peer memory (ipc) reaches only ranks of one host; "
                              "use auto or nccl");
}

std::vector<std::unique_ptr<DeviceLink>> connect_device_links(const LinkTopology& topo, int rank,
                                                              DeviceLinkSetting setting) {
  check_rank(topo, rank);
  std::vector<std::unique_ptr<DeviceLink>> links(topo.size());
  for (int p = 0; p < topo.size(); ++p)
    if (p != rank) links[p] = choose_device_link(topo, rank, p, setting).create(topo, rank, p);
  return links;
}

bool some_pair_uses(const LinkTopology& topo, DeviceLinkSetting setting, const std::string& name) {
  for (int a = 0; a < topo.size(); ++a)
    for (int b = a + 1; b < topo.size(); ++b)
      if (name == choose_device_link(topo, a, b, setting).name) return true;
  return false;
}

}  // namespace commlib
