// all_to_all (rank r's output block j = rank j's input block r; no in-place form):
//   pairwise  P-1 exchange steps; power-of-two P pairs r with r^k (symmetric exchanges), otherwise
//             step k sends to r+k and receives from r-k.
//   bruck     ceil(log2 P) rounds: block i (the block rank r holds for rank r+i) travels along the
//             set bits of i; in round k rank r packs the blocks whose index has bit k into one
//             scratch buffer, sends it to r+2^k and receives the same index set from r-2^k. Blocks
//             are packed straight from wherever they are (input, receive buffer, or scratch when
//             they wait more than one round) and finished blocks go straight to the output, so a
//             round is one local copy step + one exchange. ~count*P/2 elements per message; any P.
//   direct    one step: send every block to its rank and receive every block (sends first, peers in
//             rotated order).
#include "schedule/builders.h"
#include "schedule/registry.h"

namespace commlib {
namespace sched {

Schedule all_to_all_pairwise(const CollArgs& a) {
  const int P = a.size, r = a.rank;
  const int64_t n = a.count;
  Schedule s;
  auto in = [&](int b) { return in_region(b * n, n); };
  auto out = [&](int b) { return out_region(b * n, n); };
  s.steps.reserve(std::max(1, P - 1));
  const Op self = op_copy(out(r), in(r));
  if (P == 1) {
    s.steps.push_back(Step{{self}});
    return s;
  }
  const bool pow2 = is_pow2(P);
  for (int k = 1; k < P; ++k) {
    const int to = pow2 ? (r ^ k) : (r + k) % P;
    const int from = pow2 ? (r ^ k) : pmod(r - k, P);
    s.steps.push_back(Step{{op_send(to, in(to)), op_recv(from, out(from))}});
  }
  s.steps[0].ops.push_back(self);
  return s;
}

namespace {
// Append copy(dst, src) to a step, merging it into the previous op when both regions continue it.
void add_copy(Step& st, Region dst, Region src) {
  if (dst.count == 0) return;
  if (!st.ops.empty()) {
    Op& p = st.ops.back();
    if (p.kind == OpKind::Copy && p.dst.buf == dst.buf && p.src.buf == src.buf &&
        p.dst.offset + p.dst.count == dst.offset && p.src.offset + p.src.count == src.offset) {
      p.dst.count += dst.count;
      p.src.count += src.count;
      return;
    }
  }
  st.ops.push_back(op_copy(dst, src));
}
}  // namespace

Schedule all_to_all_bruck(const CollArgs& a) {
  const int P = a.size, r = a.rank;
  const int64_t n = a.count;
  Schedule s;
  if (P == 1) {
    s.steps.push_back(Step{{op_copy(out_region(0, n), in_region(0, n))}});
    return s;
  }
  // Block index i (0..P-1) is the block rank r holds for rank r+i; at the end it is rank
  // (r - i)'s block for r. It moves in the rounds d of the set bits of i. Where its current data
  // lives: the input (until first received), the receive buffer (just received), or tmp[i] (kept
  // between two rounds that are not consecutive). Packing for the next round reads straight from
  // wherever it is, so each round is one copy step + one exchange step.
  const int K = ceil_log2(P);
  int maxm = 0;
  for (int k = 0; k < K; ++k) {
    int m = 0;
    for (int i = 1; i < P; ++i) m += (i >> k) & 1;
    maxm = std::max(maxm, m);
  }
  const int64_t tmp0 = 0, pack0 = static_cast<int64_t>(P) * n, recv0 = pack0 + maxm * n;
  std::vector<Region> cur(P);
  for (int i = 0; i < P; ++i) cur[i] = in_region(static_cast<int64_t>((r + i) % P) * n, n);
  Step local;
  add_copy(local, out_region(r * n, n), in_region(r * n, n));
  for (int k = 0; k <= K; ++k) {
    // Pack for round k (if any) from the current locations.
    int64_t m = 0;
    if (k < K) {
      for (int i = 1; i < P; ++i)
        if ((i >> k) & 1) add_copy(local, scratch_region(pack0 + m * n, n), cur[i]), ++m;
    }
    s.steps.push_back(std::move(local));
    local = Step{};
    if (k == K) break;
    const int d = 1 << k;
    s.steps.push_back(Step{{op_send((r + d) % P, scratch_region(pack0, m * n)),
                            op_recv(pmod(r - d, P), scratch_region(recv0, m * n))}});
    // Route the received blocks: final ones to the output, ones needed after round k+1 to tmp.
    int64_t j = 0;
    for (int i = 1; i < P; ++i) {
      if (!((i >> k) & 1)) continue;
      const Region got = scratch_region(recv0 + j * n, n);
      ++j;
      const int higher = i >> (k + 1);
      if (higher == 0) {
        add_copy(local, out_region(static_cast<int64_t>(pmod(r - i, P)) * n, n), got);
      } else if (higher & 1) {
        cur[i] = got;  // packed for round k+1 in the next step, straight from the receive buffer
      } else {
        cur[i] = scratch_region(tmp0 + i * n, n);
        add_copy(local, cur[i], got);
      }
    }
  }
  if (s.steps.back().ops.empty()) s.steps.pop_back();
  s.scratch_count = recv0 + maxm * n;
  return s;
}

Schedule all_to_all_direct(const CollArgs& a) {
  const int P = a.size, r = a.rank;
  const int64_t n = a.count;
  Schedule s;
  Step x;
  x.ops.reserve(2 * P - 1);
  x.ops.push_back(op_copy(out_region(r * n, n), in_region(r * n, n)));
  // The host executor takes a step's messages in op order. Sends first: a single-copy send only
  // publishes its buffer, a receive reads a whole block before the executor moves on, so every
  // peer may start reading this rank before this rank reads anyone. Peers in rotated order (send
  // to r+1, r+2, ...; receive from r-1, r-2, ...): at each position every rank's buffer has one
  // reader, not all P-1 at once starting with rank 0's.
  for (int k = 1; k < P; ++k) {
    const int to = (r + k) % P;
    x.ops.push_back(op_send(to, in_region(to * n, n)));
  }
  for (int k = 1; k < P; ++k) {
    const int from = pmod(r - k, P);
    x.ops.push_back(op_recv(from, out_region(from * n, n)));
  }
  s.steps.push_back(std::move(x));
  return s;
}

COMMLIB_REGISTER_ALGORITHM(AllToAll, "pairwise", all_to_all_pairwise, 1, kLargeMessages,
                           "P-1 exchange rounds, one peer each");
COMMLIB_REGISTER_ALGORITHM(AllToAll, "bruck", all_to_all_bruck, 2, kSmallMessages,
                           "log P rounds, blocks forwarded through intermediate ranks");
COMMLIB_REGISTER_ALGORITHM(AllToAll, "direct", all_to_all_direct, 3, kNoTraits,
                           "one step: every block straight to its rank");

}  // namespace sched
}  // namespace commlib
