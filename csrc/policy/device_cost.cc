// The kernel path's cost model (device_cost.h).
#include "policy/device_cost.h"

#include <algorithm>
#include <vector>

#include "common/shapes.h"
#include "schedule/registry.h"

namespace commlib {

const char* device_route_name(DeviceRoute route) {
  switch (route) {
    case DeviceRoute::Mapped: return "mapped";
    case DeviceRoute::Arena: return "arena";
    case DeviceRoute::Slots: return "slots";
  }
  return "?";
}

double handshake_seconds(int size, const DeviceCostParams& params) {
  if (size < 2) return 0;
  if (size >= 4) return params.handshake_4_s;
  return params.handshake_2_s + (params.handshake_4_s - params.handshake_2_s) * (size - 2) / 2.0;
}

uint64_t staged_bytes_need(Collective coll, bool input_visible, bool output_visible, uint64_t in_bytes, uint64_t out_bytes,
                      uint64_t align) {
  if (coll == Collective::AllReduce && input_visible && output_visible) return in_bytes;  // in place
  const uint64_t in = input_visible ? in_bytes : 0;
  if (!output_visible) return in;
  return (in + align - 1) / align * align + out_bytes;
}

namespace {

constexpr uint8_t bit(BufferId b) { return static_cast<uint8_t>(1u << static_cast<int>(b)); }

// The buffers a schedule addresses at a peer (KernelPath's peer_visible_buffers, for one rank).
uint8_t peer_visible(const Schedule& s) {
  uint8_t bits = 0;
  for (const Step& st : s.steps)
    for (const Op& o : st.ops) {
      if (o.kind == OpKind::Get || o.kind == OpKind::GetReduce || reads_every_rank(o.kind)) bits |= bit(o.src.buf);
      if (o.kind == OpKind::Put || o.kind == OpKind::ReduceToAll) bits |= bit(o.dst.buf);
    }
  return bits;
}

// Staged in place (one area for input and output), a copy between the same offsets of the two moves nothing.
bool same_place(const Op& o, bool in_place) {
  const auto io = [](BufferId b) { return b == BufferId::Input || b == BufferId::Output; };
  return in_place && io(o.src.buf) && io(o.dst.buf) && o.src.offset == o.dst.offset;
}

}  // namespace

DeviceCost device_call_cost(Collective coll, const std::string& algorithm, int size, int64_t count, int elem_bytes,
                            DeviceRoute route, const DeviceCostParams& params) {
  const bool one_sided = algorithm_is_one_sided(coll, algorithm);
  const Schedule s = build_schedule(CollArgs{coll, 0, size, count, 0}, algorithm);
  const double e = elem_bytes;
  DeviceCost c;
  const uint8_t visible = one_sided && size > 1 ? peer_visible(s) : 0;
  const bool in_vis = visible & bit(BufferId::Input), out_vis = visible & bit(BufferId::Output);
  const bool staged = one_sided && route != DeviceRoute::Mapped && visible;
  const bool in_place = staged && coll == Collective::AllReduce && in_vis && out_vis;
  double t = 0;
  for (const Step& st : s.steps) {
    bool waits = false;
    for (const Op& o : st.ops) {
      const double n = static_cast<double>(std::max(o.dst.count, o.src.count)) * e;
      switch (o.kind) {
        case OpKind::Send:
        case OpKind::Recv:
        case OpKind::Get:
        case OpKind::Put: t += 2 * n; break;
        case OpKind::RecvReduce:
        case OpKind::GetReduce:
        case OpKind::Reduce: t += 3 * n; break;
        case OpKind::Copy:
          if (!same_place(o, in_place)) t += 2 * n;
          break;
        case OpKind::ReduceToAll: t += 2.0 * size * static_cast<double>(o.src.count) * e; break;
        case OpKind::ReduceFromAll: t += (size + 1.0) * static_cast<double>(o.src.count) * e; break;
        case OpKind::Signal: break;
        case OpKind::Wait: break;
      }
      waits = waits || o.kind == OpKind::Recv || o.kind == OpKind::RecvReduce || o.kind == OpKind::Wait;
    }
    c.waits += waits ? 1 : 0;
  }
  const BufferShapes shapes = buffer_shapes(coll, count, size, 0, 0);
  const uint64_t in_bytes = static_cast<uint64_t>(std::max<int64_t>(shapes.input, 0)) * elem_bytes,
                 out_bytes = static_cast<uint64_t>(std::max<int64_t>(shapes.output, 0)) * elem_bytes;
  if (visible) c.stage_need = staged_bytes_need(coll, in_vis, out_vis, in_bytes, out_bytes, kStageAlign);
  if (staged) {
    c.staged_bytes = (in_vis ? 2.0 * in_bytes : 0) + (out_vis ? 2.0 * out_bytes : 0);
    t += c.staged_bytes;
  }
  if (staged && route == DeviceRoute::Slots) c.waits += 1;  // the closing handshake
  if (one_sided) {
    // The grid KernelPath::upload sizes: a block per block_bytes of one handshake's region (an
    // all_reduce's 1/P block); on one block a grid barrier is the block's own __syncthreads.
    const double per_handshake = static_cast<double>(count) * e / (coll == Collective::AllReduce ? size : 1);
    const bool one_block = per_handshake < 2 * params.block_bytes;
    c.grid_barriers = one_block ? 0 : staged ? 2 : 1;
  } else {
    // A message plan: one block where every item fits the LL protocol (KernelPath::launch), its
    // check folded into the data handshakes where every peer has a message; else a grid, the
    // check its own exchange (a wait before the first step) and grid barrier.
    bool one_block = size > 1 && params.one_block_bytes > 0, every_peer = false;  // LL bytes 0: never
    std::vector<bool> peer(size, false);
    for (const Step& st : s.steps)
      for (const Op& o : st.ops) {
        one_block = one_block && static_cast<double>(std::max(o.dst.count, o.src.count)) * e <= params.one_block_bytes;
        if (is_message(o.kind) && o.peer >= 0 && o.peer < size) peer[o.peer] = true;
      }
    every_peer = std::count(peer.begin(), peer.end(), true) == size - 1;
    if (size > 1 && !(one_block && every_peer)) c.waits += 1;  // the descriptor check's exchange
    c.grid_barriers = one_block ? 0 : static_cast<int>(s.steps.size()) + 1;
  }
  c.traffic_bytes = t;
  const double rate = one_sided ? params.one_sided_bytes_per_s : params.message_bytes_per_s;
  c.seconds = params.launch_s + c.waits * handshake_seconds(size, params) + c.grid_barriers * params.grid_barrier_s +
              t / rate;
  return c;
}

}  // namespace commlib
