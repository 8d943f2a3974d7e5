// all_reduce as a two-shot over a grid (docs/DESIGN.md "The schedule IR"): the P ranks form R rows
// of C columns (C the largest divisor of P at most sqrt(P); rank r sits in row r / C, column
// r % C), and the two-shot's reduce-scatter and all-gather each run in two stages, along the row
// and then along the column:
//   1. row reduce-scatter: the buffer in C blocks; block j to the row's column j, reduced there in
//      column order;
//   2. column reduce-scatter: a rank's row block in R sub-blocks; sub-block i to the column's row
//      i, reduced there in row order;
//   3. column all-gather of the sub-blocks, 4. row all-gather of the blocks.
// The same bytes as two_shot (each rank sends and receives 2 (P-1)/P of the buffer), but 2(R-1) +
// 2(C-1) messages a rank instead of 2(P-1): at 128 ranks 44 instead of 254, at 1024 ranks 124
// instead of 2046. That is what the inter-host phase of a hierarchical all_reduce across many
// hosts needs, where every message costs its sender and receiver a fixed CPU time (LogGP's o)
// and the two-shot's messages, not its bytes, bound the time (docs/simulator.md, "What bounds
// it"). Every element is reduced by one rank only (column order, then row order), the others
// receive copies: bitwise identical everywhere. A prime P has C = 1 (the plain two-shot).
#include <algorithm>
#include <vector>

#include "schedule/builders.h"
#include "schedule/registry.h"
#include "schedule/subgroup.h"

namespace commlib {
namespace sched {

namespace {

int grid_columns(int P) {
  int c = 1;
  for (int d = 2; d * d <= P; ++d)
    if (P % d == 0) c = d;
  return c;
}

// Pieces the buffer is cut into at most, and the fewest elements of a piece: the stages of
// consecutive pieces share steps (a row stage beside a column stage, their peers disjoint), so a
// step carries about one piece's row traffic and the next one's column traffic.
constexpr int64_t kMaxPieces = 6;
constexpr int64_t kMinPiece = 4096;

// One direct reduce-scatter stage among `peers` (this rank is peers[own]) of `whole`, cut in
// peers.size() blocks: block j to peers[j], reduced there in the peers' order into the same place
// of the output. Its contribution is read from `src` (the input, or the output once the stage
// before reduced it there). Its receive slots from scratch element `slots`; raises scratch_end.
std::vector<Step> reduce_scatter_stage(const std::vector<int>& peers, int own, Region whole, BufferId src,
                                       int64_t slots, int64_t& scratch_end) {
  const int n = static_cast<int>(peers.size());
  Schedule s;
  auto block = [&](BufferId b, int j) {
    return Region{b, whole.offset + blk_off(whole.count, n, j), blk_len(whole.count, n, j)};
  };
  if (n == 1) {
    if (src != BufferId::Output) s.steps.push_back(Step{{op_copy(block(BufferId::Output, 0), block(src, 0))}});
    return s.steps;
  }
  const int64_t mine = blk_len(whole.count, n, own);
  std::vector<Region> srcs(n);
  Step x;
  for (int j = 0, slot = 0; j < n; ++j) {
    if (j == own) {
      srcs[j] = block(src, own);
      continue;
    }
    srcs[j] = scratch_region(slots + slot++ * mine, mine);
    x.ops.push_back(op_send(peers[j], block(src, j)));
    x.ops.push_back(op_recv(peers[j], srcs[j]));
  }
  s.steps.push_back(std::move(x));
  append_ordered_reduce(s, block(BufferId::Output, own), srcs, own);
  scratch_end = std::max(scratch_end, slots + (n - 1) * mine);
  return s.steps;
}

// The direct all-gather matching reduce_scatter_stage: this rank's reduced block of `whole` (in
// the output) to every peer, theirs from them.
std::vector<Step> all_gather_stage(const std::vector<int>& peers, int own, Region whole) {
  const int n = static_cast<int>(peers.size());
  if (n == 1) return {};
  auto block = [&](int j) {
    return Region{BufferId::Output, whole.offset + blk_off(whole.count, n, j), blk_len(whole.count, n, j)};
  };
  Step g;
  for (int j = 0; j < n; ++j) {
    if (j == own) continue;
    g.ops.push_back(op_send(peers[j], block(own)));
    g.ops.push_back(op_recv(peers[j], block(j)));
  }
  return {std::move(g)};
}

void append(Schedule& s, std::vector<Step> steps) {
  for (Step& st : steps) s.steps.push_back(std::move(st));
}

Schedule all_reduce_grid(const CollArgs& a) {
  const int P = a.size, r = a.rank, C = grid_columns(P), R = P / C, row = r / C, col = r % C;
  const int64_t n = a.count;
  Schedule s;
  if (P == 1) {
    s.steps.push_back(Step{{op_copy(out_region(0, n), in_region(0, n))}});
    return s;
  }
  std::vector<int> across_row(C), down_column(R);
  for (int j = 0; j < C; ++j) across_row[j] = row * C + j;
  for (int i = 0; i < R; ++i) down_column[i] = i * C + col;
  const int p = static_cast<int>(std::clamp<int64_t>(n / kMinPiece, 1, kMaxPieces));
  auto piece = [&](int q) { return out_region(blk_off(n, p, q), blk_len(n, p, q)); };
  auto block = [&](int q) {  // this rank's block of piece q (its column's), reduced along the row
    const Region w = piece(q);
    return Region{BufferId::Output, w.offset + blk_off(w.count, C, col), blk_len(w.count, C, col)};
  };
  // Scratch: the row stage's C-1 slots of the largest block, then the column stage's R-1.
  const int64_t col_slots = (C - 1) * blk_len(blk_len(n, p, 0), C, 0);
  int64_t end = 0;
  // Reduce-scatter: slot k holds the row stage of piece k and the column stage of piece k-1;
  // all-gather: the column stage of piece k and the row stage of piece k-1.
  for (int k = 0; k <= p; ++k) {
    std::vector<Step> by_row = k < p ? reduce_scatter_stage(across_row, col, piece(k), BufferId::Input, 0, end)
                                     : std::vector<Step>{};
    std::vector<Step> by_col = k > 0 ? reduce_scatter_stage(down_column, row, block(k - 1), BufferId::Output,
                                                            col_slots, end)
                                     : std::vector<Step>{};
    append(s, zip_steps({by_row, by_col}));
  }
  for (int k = 0; k <= p; ++k)
    append(s, zip_steps({k < p ? all_gather_stage(down_column, row, block(k)) : std::vector<Step>{},
                               k > 0 ? all_gather_stage(across_row, col, piece(k - 1)) : std::vector<Step>{}}));
  s.scratch_count = end;
  return s;
}

}  // namespace

COMMLIB_REGISTER_ALGORITHM(AllReduce, "grid", all_reduce_grid, 11, kLargeMessages,
                           "two-shot over a rows x columns grid: 2(R+C-2) messages a rank instead of 2(P-1)");

}  // namespace sched
}  // namespace commlib
