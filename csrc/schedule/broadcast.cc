// broadcast from `root` (relative ranks vr = rank - root mod P):
//   binomial          vr receives from vr - lowbit(vr), then sends to vr + 2^k for 2^k < lowbit(vr)
//                     (largest first). ceil(log2 P) rounds of the whole message.
//   scatter_allgather van de Geijn: binomial scatter of the P blocks (block v to relative rank v,
//                     each subtree receiving its contiguous block range), then a ring all-gather
//                     in relative rank order. ~2x the bandwidth-optimal volume, any P.
//   shared            direct's messages; on one host the root writes the message once into its
//                     shared-memory stream and every rank copies it out (host/flag_calls.cc).
//   pipeline          chain root -> root+1 -> ... with the message cut into S segments; in step t a
//                     rank receives segment t and forwards segment t-1, so the P-1 hops overlap.
//                     S = clamp(count / 64, 1, 2P): segments of at least 64 elements, and at most
//                     2P of them (the executor chunks further for bandwidth); time ~ (P-2+S) * seg.
#include "schedule/builders.h"
#include "schedule/registry.h"

namespace commlib {
namespace sched {

Schedule broadcast_binomial(const CollArgs& a) {
  const int P = a.size, r = a.rank;
  const int64_t n = a.count;
  Schedule s;
  const Region in = in_region(0, n), out = out_region(0, n);
  if (r == a.root) s.steps.push_back(Step{{op_copy(out, in)}});
  // The root sends from its input; the copy above may share its step (in-place it is a no-op).
  Schedule b;
  append_binomial_bcast(b, r, P, a.root, in, out);
  if (r == a.root && !b.steps.empty()) {
    b.steps[0].ops.push_back(s.steps[0].ops[0]);
    return b;
  }
  for (auto& st : b.steps) s.steps.push_back(std::move(st));
  return s;
}

Schedule broadcast_scatter_allgather(const CollArgs& a) {
  const int P = a.size, r = a.rank, root = a.root;
  const int64_t n = a.count;
  Schedule s;
  const int vr = pmod(r - root, P);
  auto real = [&](int v) { return pmod(v + root, P); };
  auto range = [&](int v0, int v1) {
    const int64_t o = blk_off(n, P, v0);
    return out_region(o, blk_off(n, P, v1) - o);
  };
  if (vr == 0) s.steps.push_back(Step{{op_copy(out_region(0, n), in_region(0, n))}});
  if (P == 1) return s;
  const int sub = subtree_size(vr, P);
  if (vr != 0) s.steps.push_back(Step{{op_recv(real(vr - lowbit(vr)), range(vr, vr + sub))}});
  const int top = vr == 0 ? pow2_floor(2 * P - 1) : lowbit(vr);
  for (int mask = top >> 1; mask >= 1; mask >>= 1) {
    const int child = vr + mask;
    if (child >= P) continue;
    s.steps.push_back(Step{{op_send(real(child), range(child, child + std::min(mask, P - child)))}});
  }
  const int next = real(vr + 1), prev = real(vr - 1);
  for (int k = 0; k < P - 1; ++k) {
    const int sb = pmod(vr - k, P), rb = pmod(vr - k - 1, P);
    s.steps.push_back(Step{{op_send(next, range(sb, sb + 1)), op_recv(prev, range(rb, rb + 1))}});
  }
  return s;
}

Schedule broadcast_pipeline(const CollArgs& a) {
  const int P = a.size, r = a.rank, root = a.root;
  const int64_t n = a.count;
  Schedule s;
  const int vr = pmod(r - root, P);
  const Region in = in_region(0, n), out = out_region(0, n);
  if (P == 1) {
    s.steps.push_back(Step{{op_copy(out, in)}});
    return s;
  }
  const int S = static_cast<int>(std::max<int64_t>(1, std::min<int64_t>(n / 64, 2 * P)));
  auto seg = [&](BufferId b, int t) { return Region{b, blk_off(n, S, t), blk_len(n, S, t)}; };
  const int next = pmod(r + 1, P), prev = pmod(r - 1, P);
  if (vr == 0) {
    for (int t = 0; t < S; ++t) s.steps.push_back(Step{{op_send(next, seg(BufferId::Input, t))}});
    s.steps[0].ops.push_back(op_copy(out, in));
    return s;
  }
  const bool last = vr == P - 1;
  for (int t = 0; t <= S; ++t) {
    Step st;
    if (t < S) st.ops.push_back(op_recv(prev, seg(BufferId::Output, t)));
    if (t >= 1 && !last) st.ops.push_back(op_send(next, seg(BufferId::Output, t - 1)));
    if (!st.ops.empty()) s.steps.push_back(std::move(st));
  }
  return s;
}

// Flat: the root sends the whole buffer to every rank in one step; everyone else receives once.
// One hop instead of log2(P): the root pays P-1 sends, which for small messages are cheaper than
// the extra hop (and, with more ranks than cores, than waiting for a forwarding rank to run).
Schedule broadcast_direct(const CollArgs& a) {
  const int P = a.size, r = a.rank, root = a.root;
  const int64_t n = a.count;
  Schedule s;
  const Region in = in_region(0, n), out = out_region(0, n);
  Step st;
  if (r == root) {
    for (int k = 1; k < P; ++k) st.ops.push_back(op_send(pmod(root + k, P), in));
    st.ops.push_back(op_copy(out, in));
  } else {
    st.ops.push_back(op_recv(root, out));
  }
  s.steps.push_back(std::move(st));
  return s;
}

COMMLIB_REGISTER_ALGORITHM(Broadcast, "binomial", broadcast_binomial, 1, kSmallMessages,
                           "binomial tree from the root");
COMMLIB_REGISTER_ALGORITHM(Broadcast, "scatter_allgather", broadcast_scatter_allgather, 2, kLargeMessages,
                           "scatter from the root, then ring all-gather (van de Geijn)");
COMMLIB_REGISTER_ALGORITHM(Broadcast, "pipeline", broadcast_pipeline, 3, kLargeMessages,
                           "chunks pipelined down a chain");
COMMLIB_REGISTER_ALGORITHM(Broadcast, "direct", broadcast_direct, 4, kSmallMessages,
                           "the root sends to every rank");
// The messages of direct; where every rank shares one host's memory the host engine runs it as one
// write of the root into its shared stream that every rank copies out (host/flag_calls.cc). Host
// only (kHostOnly): on a device it would be direct's messages, so device auto never takes it.
COMMLIB_REGISTER_ALGORITHM(Broadcast, "shared", broadcast_direct, 5, kLargeMessages | kHostOnly,
                           "one write into shared memory, copied out by every rank (one host)");

}  // namespace sched
}  // namespace commlib
