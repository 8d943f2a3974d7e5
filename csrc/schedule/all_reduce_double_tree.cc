// all_reduce double_tree (NCCL's double binary tree, for mid sizes): half of the buffer is reduced up
// and broadcast down a binary tree A, the other half along a tree B in which every rank that is
// interior in A is a leaf, so every rank sends and receives about one half's worth of data in each
// direction, with log P depth instead of the ring's P steps. Each half moves in segments, pipelined:
// a node forwards segment s while its children send it s+1.
//
// Trees: labels v = 1..P (rank v-1 for A), in-order with the root of a label range the label with
// the largest lowest set bit (the largest power of two <= P for the whole range), so interior nodes
// have even labels (odd ranks). B relabels A: rank r plays A's rank P-1-r when P is even (mirrored)
// or (r-1) mod P when P is odd (shifted), either way interior nodes of B are even ranks.
//
// Timing (global steps, so a send and its receive sit in the same step of both ranks): a leaf sends
// segment s up at step s; a node with delay D sends segment s up (or, at the root, down) at s + D,
// where D = D(child) + 1 with one child and max(D(left), D(right)) + 2 with two: the left child's
// segment is reduced as it arrives (recv_reduce from the input into the output), the right one's
// lands in scratch and is reduced the step after the later of the two. Down the tree each level
// forwards one step after it received. Only the root computes final values; the broadcast copies
// its bits, so all ranks end bitwise identical. Tree A's ops take the even steps and B's the odd
// ones: a rank may be a child of one peer in A and its parent in B, and the IR allows one send to
// and one receive from each peer per step.
#include <vector>

#include "schedule/builders.h"
#include "schedule/registry.h"

namespace commlib {
namespace sched {

namespace {

struct TreeNode {
  int parent = -1, left = -1, right = -1;  // ranks in the tree's own numbering
};

// The in-order tree over labels [lo, hi] (1-based): fills nodes for rank label-1, returns the root.
int build_tree(std::vector<TreeNode>& nodes, int lo, int hi, int parent) {
  if (lo > hi) return -1;
  int root = lo;
  for (int b = 1 << 30; b > 0; b >>= 1) {
    const int v = (hi / b) * b;  // the largest multiple of b <= hi
    if (v >= lo && v > 0) {
      root = v;
      break;
    }
  }
  TreeNode& n = nodes[root - 1];
  n.parent = parent;
  const int l = build_tree(nodes, lo, root - 1, root - 1);
  const int r = build_tree(nodes, root + 1, hi, root - 1);
  // A node with one child holds it as `left` (its segment is reduced from the input as it arrives).
  nodes[root - 1].left = l >= 0 ? l : r, nodes[root - 1].right = l >= 0 ? r : -1;
  return root - 1;
}

// Delay of every node (see above), children first.
int delay(const std::vector<TreeNode>& t, int v, std::vector<int>& d) {
  if (v < 0) return -1;
  const int dl = delay(t, t[v].left, d), dr = delay(t, t[v].right, d);
  d[v] = dl < 0 && dr < 0 ? 0 : (dl >= 0 && dr >= 0 ? std::max(dl, dr) + 2 : std::max(dl, dr) + 1);
  return d[v];
}

// Appends the ops of one tree at steps 2*t + parity of `steps`; `to_rank` maps the tree's numbering
// to ranks; the half is [base, base + len) of the buffers, cut into `segs` segments.
void append_tree(std::vector<Step>& steps, int parity, const std::vector<TreeNode>& t, int me,
                 const std::vector<int>& to_rank, int64_t base, int64_t len, int segs) {
  std::vector<int> d(t.size(), 0);
  int root = 0;
  while (t[root].parent >= 0) root = t[root].parent;
  delay(t, root, d);
  std::vector<int> f(t.size(), 0);  // step offset at which a node sends down (children: parent's + 1)
  for (int v = 0; v < static_cast<int>(t.size()); ++v) {
    int depth = 0;
    for (int u = v; t[u].parent >= 0; u = t[u].parent) ++depth;
    f[v] = d[root] + depth;
  }
  const TreeNode& n = t[me];
  auto at = [&](int step) -> Step& {
    const size_t k = 2 * static_cast<size_t>(step) + parity;
    if (steps.size() <= k) steps.resize(k + 1);
    return steps[k];
  };
  auto seg = [&](BufferId b, int s) { return Region{b, base + blk_off(len, segs, s), blk_len(len, segs, s)}; };
  for (int s = 0; s < segs; ++s) {
    const Region out = seg(BufferId::Output, s), in = seg(BufferId::Input, s);
    if (n.left < 0 && n.right < 0 && n.parent < 0) at(s).ops.push_back(op_copy(out, in));  // one rank
    if (n.left >= 0) at(s + d[n.left]).ops.push_back(op_recv_reduce_from(to_rank[n.left], out, in));
    if (n.right >= 0) at(s + d[n.right]).ops.push_back(op_recv(to_rank[n.right], seg(BufferId::Scratch, s)));
    if (n.left >= 0 && n.right >= 0)
      at(s + std::max(d[n.left], d[n.right]) + 1).ops.push_back(op_reduce(out, seg(BufferId::Scratch, s)));
    if (n.parent >= 0) {
      at(s + d[me]).ops.push_back(op_send(to_rank[n.parent], n.left < 0 && n.right < 0 ? in : out));
      at(s + f[n.parent]).ops.push_back(op_recv(to_rank[n.parent], out));
    }
    for (int c : {n.left, n.right})
      if (c >= 0) at(s + f[me]).ops.push_back(op_send(to_rank[c], out));
  }
}

Schedule all_reduce_double_tree(const CollArgs& a) {
  const int P = a.size, r = a.rank;
  const int64_t n = a.count;
  std::vector<TreeNode> tree(P);
  build_tree(tree, 1, P, -1);
  std::vector<int> ident(P), mapped(P);
  for (int v = 0; v < P; ++v) ident[v] = v, mapped[v] = P % 2 == 0 ? P - 1 - v : (v + 1) % P;
  // Segments of about 32 Ki elements (128 KiB of float32), at most 32 per half.
  const int64_t half0 = blk_len(n, 2, 0), half1 = blk_len(n, 2, 1);
  const int segs = static_cast<int>(std::min<int64_t>(32, std::max<int64_t>(1, (half0 + 32767) / 32768)));
  Schedule s;
  append_tree(s.steps, 0, tree, r, ident, 0, half0, segs);
  // In B rank mapped[v] plays A's node v: rank r is node (P-1-r) mirrored or (r-1) mod P shifted.
  const int me_b = P % 2 == 0 ? P - 1 - r : (r + P - 1) % P;
  append_tree(s.steps, 1, tree, me_b, mapped, half0, half1, segs);
  std::vector<Step> kept;
  for (Step& st : s.steps)
    if (!st.ops.empty()) kept.push_back(std::move(st));
  s.steps = std::move(kept);
  s.scratch_count = n;
  return s;
}

}  // namespace

COMMLIB_REGISTER_ALGORITHM(AllReduce, "double_tree", all_reduce_double_tree, 10, kSmallMessages | kLargeMessages,
                           "NCCL's double binary tree: each half reduced and broadcast along its own pipelined tree");

}  // namespace sched
}  // namespace commlib
