// The segment layout and intra-host phases of hierarchical all_reduce, shared by its plain, pipelined
// and composed schedules (hierarchical_all_reduce.cc) and the overlapped pipeline
// (hierarchical_overlap.cc). Internal to csrc/schedule.
#pragma once

#include <algorithm>
#include <string>
#include <vector>

#include "schedule/builders.h"
#include "schedule/hierarchical_hosts.h"
#include "schedule/registry.h"
#include "schedule/subgroup.h"

namespace commlib {
namespace sched {

// Segments cap the per-step overhead (one header and one wake-up per peer per step).
constexpr int kMaxSegments = 16;

// 1 (the plain schedule) unless there are two hosts or more (else there is no inter-host transfer
// to overlap) and the message spans two segments.
inline int pipeline_segments(const CollArgs& a, const HostMap& m) {
  if (m.H() < 2 || a.segment <= 0) return 1;
  return static_cast<int>(std::clamp<int64_t>(a.count / a.segment, 1, kMaxSegments));
}

inline std::vector<Step> ordered_reduce_steps(Region dst, const std::vector<Region>& srcs, int own) {
  Schedule tmp;
  append_ordered_reduce(tmp, dst, srcs, own);
  return tmp.steps;
}

// The block layout of K segments and the intra-host phases, from this rank's point of view.
// Scratch: [L-1 reduce-scatter receive slots of max_range][what the inter phase needs].
struct Layout {
  const HostMap& m;
  int K, r, h, i, L, H, B;
  // The intra-host phases may run a segment in `chunks` pieces (the overlapped pipeline): piece
  // `chunk` of every range. Declared before max_range, which is the whole range's.
  int chunk = 0, chunks = 1;
  int64_t n, max_range;  // max_range: this rank's longest range of any segment
  // Ramped segments (rail_halving, session 23): the first and the last of the `steady` equal
  // segments each cut in ramp + 1 segments of 1/2^ramp, 1/2^ramp, 2/2^ramp, .., 1/2 of it (the
  // last in the reverse order), so that the pipeline's fill (the first segment's reduce-scatter,
  // nothing beside it on the NICs) and drain (the last one's all-gather) shrink; K counts them all.
  // Not where a ramp piece would hold fewer elements than a segment has blocks (then equal).
  int steady, ramp;
  std::vector<int64_t> cut;  // segment t is [cut[t], cut[t + 1])

  Layout(const CollArgs& a, const HostMap& hosts, int segments, int ramp_depth = 0)
      : m(hosts), K(segments), r(a.rank), h(hosts.host[a.rank]), i(hosts.local[a.rank]), L(hosts.L(h)),
        H(hosts.H()), B(hosts.max_L()), n(a.count), max_range(0), steady(segments), ramp(0) {
    for (int t = 0; t <= segments; ++t) cut.push_back(blk_off(n, segments, t));
    if (ramp_depth > 0 && segments >= 2 && blk_len(n, segments, segments - 1) >> ramp_depth >= B) {
      ramp = ramp_depth;
      const int64_t first = cut[1], last = n - cut[segments - 1];
      std::vector<int64_t> c{0};
      for (int k = 1; k <= ramp; ++k) c.push_back((first << (k - 1)) >> ramp);
      for (int t = 1; t < segments; ++t) c.push_back(cut[t]);
      for (int k = ramp; k >= 1; --k) c.push_back(n - ((last << (k - 1)) >> ramp));
      c.push_back(n);
      cut = std::move(c);
      K = static_cast<int>(cut.size()) - 1;
    }
    // Equal segments: segment 0 is the longest (blk_len); ramped: the longest is a steady one.
    for (int t = 0; t < (ramp ? K : 1); ++t) max_range = std::max(max_range, range(BufferId::Input, t, i).count);
  }
  // The same layout from another rank's point of view.
  Layout as_rank(const CollArgs& other) const { return Layout(other, m, steady, ramp); }

  int first(int g, int j) const { return j * B / m.L(g); }
  int owner(int g, int b) const {
    int j = 0;
    while (first(g, j + 1) <= b) ++j;
    return m.hosts[g][j];
  }
  Region span(BufferId buf, int t, int b0, int b1) const {  // blocks [b0, b1) of segment t
    const int64_t so = cut[t], sl = cut[t + 1] - cut[t], o = blk_off(sl, B, b0);
    return Region{buf, so + o, blk_off(sl, B, b1) - o};
  }
  Region range(BufferId buf, int t, int j) const {
    const Region whole = span(buf, t, first(h, j), first(h, j + 1));
    if (chunks == 1) return whole;
    return Region{buf, whole.offset + blk_off(whole.count, chunks, chunk), blk_len(whole.count, chunks, chunk)};
  }
  int64_t rs_scratch() const { return (L - 1) * max_range; }

  // (1) reduce-scatter of segment t within the host: the messages, then the ordered reduction.
  void rs_comm(int t, Step& x) const {
    for (int j = 0, slot = 0; j < L; ++j) {
      if (j == i) continue;
      const int q = m.hosts[h][j];
      x.ops.push_back(op_send(q, range(BufferId::Input, t, j)));
      x.ops.push_back(op_recv(q, scratch_region(slot++ * max_range, range(BufferId::Input, t, i).count)));
    }
  }
  std::vector<Step> rs_reduce(int t) const {
    const Region mine_in = range(BufferId::Input, t, i), mine_out = range(BufferId::Output, t, i);
    if (L == 1) return {Step{{op_copy(mine_out, mine_in)}}};
    std::vector<Region> srcs(L);
    for (int j = 0, slot = 0; j < L; ++j)
      srcs[j] = j == i ? mine_in : scratch_region(slot++ * max_range, mine_in.count);
    return ordered_reduce_steps(mine_out, srcs, i);
  }
  std::vector<Step> rs(int t) const {
    Step x;
    rs_comm(t, x);
    std::vector<Step> steps;
    if (!x.ops.empty()) steps.push_back(std::move(x));
    for (Step& st : rs_reduce(t)) steps.push_back(std::move(st));
    return steps;
  }
  // (3) all-gather of segment t within the host.
  void ag_comm(int t, Step& x) const {
    for (int j = 0; j < L; ++j) {
      if (j == i) continue;
      const int q = m.hosts[h][j];
      x.ops.push_back(op_send(q, range(BufferId::Output, t, i)));
      x.ops.push_back(op_recv(q, range(BufferId::Output, t, j)));
    }
  }
};

inline void append_steps(Schedule& s, std::vector<Step> steps) {
  for (Step& st : steps) s.steps.push_back(std::move(st));
}

// The intra-host phases through CollArgs::intra_algorithm (a name registered for reduce_scatter
// and all_gather) on the host's sub-group. The host's ranges of a segment differ by up to a block
// (B blocks over L ranks), while a registered collective moves equal blocks: each range is packed
// into a slot of the host's largest range (the rest of the slot filled from the input, so nothing
// undefined travels; its result is dropped), the sub-collective runs on the slots, and the result
// is unpacked. Scratch from `base`: [L slots][L result slots][the sub-collective's scratch]; the
// two phases run one after another, so they share it (base 0: the inter phase's too, when that runs
// after them; the overlapped pipeline puts it past the inter phase's).
struct IntraPhases {
  const Layout& y;
  const std::string& algo;     // the reduce-scatter's algorithm
  const std::string& ag_algo;  // the all-gather's (the same name unless a caller pairs two: rail_halving)
  int64_t pad0;  // the largest range of any segment (ramped segments: not segment 0): the slot stride
  int64_t base;  // where its scratch starts

  IntraPhases(const Layout& layout, const std::string& name, int64_t scratch_base = 0)
      : IntraPhases(layout, name, name, scratch_base) {}
  IntraPhases(const Layout& layout, const std::string& rs_name, const std::string& ag_name, int64_t scratch_base)
      : y(layout), algo(rs_name), ag_algo(ag_name), pad0(0), base(scratch_base) {
    for (int t = 0; t < (y.ramp ? y.K : 1); ++t) pad0 = std::max(pad0, pad(t));  // as Layout's max_range
  }
  int64_t pad(int t) const {
    int64_t p = 0;
    for (int j = 0; j < y.L; ++j) p = std::max(p, y.range(BufferId::Input, t, j).count);
    return p;
  }
  int64_t scratch_end() const { return base + 2 * y.L * pad0 + sub_scratch_; }
  Subgroup group() const {
    Subgroup g;
    g.members = y.m.hosts[y.h];
    g.input = Rebase{BufferId::Scratch, base};
    g.output = Rebase{BufferId::Scratch, base + y.L * pad0};
    g.scratch = Rebase{BufferId::Scratch, base + 2 * y.L * pad0};
    return g;
  }
  // Copies `src` into the slot at `slot_off` of `p` elements, the rest from segment t's input.
  void pack(Step& st, int64_t slot_off, Region src, int t, int64_t p) const {
    st.ops.push_back(op_copy(scratch_region(slot_off, src.count), src));
    const Region seg = y.span(BufferId::Input, t, 0, y.B);
    if (p > src.count) st.ops.push_back(op_copy(scratch_region(slot_off + src.count, p - src.count), Region{BufferId::Input, seg.offset, p - src.count}));
  }
  std::vector<Step> rs(int t) {
    const int64_t p = pad(t);
    if (y.L == 1 || p == 0) return y.rs(t);
    Schedule s;
    Step in;
    for (int j = 0; j < y.L; ++j) pack(in, base + j * p, y.range(BufferId::Input, t, j), t, p);
    s.steps.push_back(std::move(in));
    note(append_to(s, on_subgroup(Collective::ReduceScatter, algo, y.r, p, 0, group(), "intra_algorithm")));
    const Region mine = y.range(BufferId::Output, t, y.i);
    if (mine.count) s.steps.push_back(Step{{op_copy(mine, scratch_region(base + y.L * pad0, mine.count))}});
    return s.steps;
  }
  std::vector<Step> ag(int t) {
    const int64_t p = pad(t);
    if (y.L == 1 || p == 0) return {};
    Schedule s;
    Step in;
    pack(in, base, y.range(BufferId::Output, t, y.i), t, p);
    s.steps.push_back(std::move(in));
    note(append_to(s, on_subgroup(Collective::AllGather, ag_algo, y.r, p, 0, group(), "intra_algorithm")));
    Step out;
    for (int j = 0; j < y.L; ++j) {
      const Region theirs = y.range(BufferId::Output, t, j);
      if (j != y.i && theirs.count) out.ops.push_back(op_copy(theirs, scratch_region(base + y.L * pad0 + j * p, theirs.count)));
    }
    if (!out.ops.empty()) s.steps.push_back(std::move(out));
    return s.steps;
  }

 private:
  int64_t sub_scratch_ = 0;
  static int64_t append_to(Schedule& s, const Schedule& more) {
    s.steps.insert(s.steps.end(), more.steps.begin(), more.steps.end());
    return more.scratch_count;
  }
  void note(int64_t end) { sub_scratch_ = std::max(sub_scratch_, end - base - 2 * y.L * pad0); }
};


// (2) of segment t: every block this rank owns all-reduced in place on the sub-group of its owners
// (subgroup.h), one block after another (each in `pieces` pieces one after another: the overlapped
// pipeline), with scratch from x_base; raises scratch_end to cover it. `build(g, count)` is one
// piece's sub-schedule in the parent's terms: how the owners all-reduce it.
template <class Build>
inline std::vector<Step> owners_phase(const Layout& y, int t, int64_t x_base, int64_t& scratch_end, int pieces,
                                      Build build) {
  Schedule tmp;
  if (y.H < 2) return tmp.steps;
  for (int b = y.first(y.h, y.i); b < y.first(y.h, y.i + 1); ++b) {
    Subgroup g;
    for (int x = 0; x < y.H; ++x) g.members.push_back(y.owner(x, b));
    const Region blk = y.span(BufferId::Output, t, b, b + 1);
    for (int q = 0; q < pieces; ++q) {
      g.input = g.output = Rebase{BufferId::Output, blk.offset + blk_off(blk.count, pieces, q)};
      g.scratch = Rebase{BufferId::Scratch, x_base};
      append_schedule(tmp, build(g, blk_len(blk.count, pieces, q)));
    }
  }
  scratch_end = std::max(scratch_end, tmp.scratch_count);
  return tmp.steps;
}

// owners_phase by CollArgs::inter_algorithm, a registered algorithm (the composed inter phase).
inline std::vector<Step> inter_phase(const CollArgs& a, const Layout& y, int t, int64_t x_base, int64_t& scratch_end,
                                     int pieces = 1) {
  return owners_phase(y, t, x_base, scratch_end, pieces, [&](const Subgroup& g, int64_t count) {
    return on_subgroup(Collective::AllReduce, a.inter_algorithm, y.r, count, 0, g);
  });
}

// How the overlapped pipeline lays out a tick. The defaults are hierarchical's: the intra lane
// runs the all-gather of segment t-1 before the reduce-scatter of t+1 (both with
// CollArgs::intra_algorithm), and the lanes pair by their talking steps' count, the one with fewer
// cut into pieces. rail_halving (rail_halving.cc) pairs lanes whose steps halve and double: the
// reduce-scatter first (its rounds shrink as the inter lane's halving does, then the all-gather's
// grow as its doubling does), separate names for the two intra phases, and the lanes paired by
// their steps' elements, uncut (merge_by_elements in hierarchical_overlap.cc).
struct OverlapShape {
  bool rs_first = false;
  bool by_elements = false;
  std::string intra_rs, intra_ag;  // empty: CollArgs::intra_algorithm
};

// The overlapped pipeline (hierarchical_overlap.cc): every composition on hosts of equal size, each
// tick's inter-host phase zipped beside the intra-host phases of its neighbours. Empty (no
// steps) when it does not apply: fewer than two hosts or segments, or unequal hosts.
Schedule all_reduce_overlapped(const CollArgs& a, const Layout& y, const OverlapShape& shape = OverlapShape{});

// Whether all_reduce_overlapped reuses a host's aligned intra lanes of a tick across its local
// ranks (a per-thread memo, hierarchical_overlap.cc); returns the previous value. On by default;
// off only to check that the memo changes nothing (tests: _C.set_overlap_memo).
bool set_overlap_memo(bool on);

}  // namespace sched
}  // namespace commlib
