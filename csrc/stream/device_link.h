// The link that carries one pair of ranks' device messages in the stream engine, chosen per pair
// here in C++, the way NCCL chooses its transports: an ordered table of link kinds {name,
// can_connect, create}; the first kind that can connect a pair carries it.
//
//   ipc   peer memory: messages move chunk by chunk through the receiver's inbox, ordered by
//         counters in the control regions (stream_engine.h). Needs one machine: the control
//         region is opened through /proc and the inbox imported as device memory.
//   nccl  NCCL (stream/nccl_link.h): a step's messages to every peer on this link go as one
//         ncclGroupStart .. ncclSend/ncclRecv .. ncclGroupEnd. A peer on another host has no
//         control region mapped here, so its call descriptors go in band over NCCL as well
//         (remote_descriptors.*); a peer on this host still uses its control region for them.
//
// COMMLIB_DEVICE_LINK (the same on every rank: commlib/device/nccl_comm.py agrees on it through
// the store before the choice) restricts the table: auto lets both kinds in (ipc within a host,
// nccl across, by table order), ipc or nccl only that one. A pair no kind can connect (ipc across
// hosts) is refused with std::invalid_argument naming the setting, on every rank alike.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace commlib {

enum class DeviceLinkSetting : uint8_t { Auto, Ipc, Nccl };
// COMMLIB_DEVICE_LINK (case and surrounding blanks ignored; empty = auto); std::invalid_argument
// naming the variable for anything else.
DeviceLinkSetting device_link_setting_from_env();
DeviceLinkSetting parse_device_link_setting(const std::string& value);
const char* device_link_setting_name(DeviceLinkSetting s);

// What the choice depends on: the host of every rank (the communicator's host map).
struct LinkTopology {
  std::vector<int> host_of;  // a host index per rank (Communicator::host_of)
  int size() const { return static_cast<int>(host_of.size()); }
  bool same_host(int a, int b) const { return host_of[a] == host_of[b]; }
};

// One peer's link, as the engine's call code sees it: what it asks before enqueueing a message
// or a call descriptor for that peer.
class DeviceLink {
 public:
  virtual ~DeviceLink() = default;
  virtual const char* name() const = 0;
  // Messages move chunk by chunk through the peer's inbox (the engine's send_chunk/recv_chunk);
  // false: whole messages in the link's group per step (NcclLink::enqueue_step / enqueue_p2p).
  virtual bool through_peer_memory() const = 0;
  // The call and message descriptors go in band, over this link (remote_descriptors.*), because the
  // peer's control region is not mapped here (another host).
  virtual bool descriptors_in_band() const = 0;
};

struct DeviceLinkKind {
  const char* name;
  // Whether this kind can carry the pair (a, b) of `topo` under `setting`.
  bool (*can_connect)(const LinkTopology& topo, int a, int b, DeviceLinkSetting setting);
  // The link of `me` to `peer`.
  std::unique_ptr<DeviceLink> (*create)(const LinkTopology& topo, int me, int peer);
};

// The kinds in order of preference (ipc, then nccl).
const std::vector<DeviceLinkKind>& device_link_kinds();
// The kind that carries the pair (a, b); std::invalid_argument naming COMMLIB_DEVICE_LINK when
// none can (the message names the lower rank first, so every rank of the pair says the same).
const DeviceLinkKind& choose_device_link(const LinkTopology& topo, int a, int b, DeviceLinkSetting setting);
// `rank`'s link to every rank (null for itself). Every pair of the world is checked, not only
// `rank`'s: a pair no kind connects fails every rank together, before anything is opened.
std::vector<std::unique_ptr<DeviceLink>> connect_device_links(const LinkTopology& topo, int rank,
                                                              DeviceLinkSetting setting);
// Whether some pair of the world is carried by the kind `name` (NCCL's communicator is created by
// every rank together, so a rank whose own pairs are all ipc joins it too).
bool some_pair_uses(const LinkTopology& topo, DeviceLinkSetting setting, const std::string& name);

}  // namespace commlib
