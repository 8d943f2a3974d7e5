// The intra-host lanes of the overlapped hierarchical pipeline (hierarchical_overlap.cc): each
// local rank's all-gather / reduce-scatter lane of a tick, a host's lanes aligned in rounds, and the
// per-thread memo that builds them once per host and tick for all its local ranks.
#include "schedule/overlap_intra.h"

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <limits>
#include <memory>

namespace commlib {
namespace sched {

bool step_talks(const Step& st) {
  return std::any_of(st.ops.begin(), st.ops.end(), [](const Op& o) { return is_message(o.kind); });
}

// The elements a step moves through the busier direction of its rank (sent or received).
int64_t step_elements(const Step& st) {
  int64_t out = 0, in = 0;
  for (const Op& o : st.ops) {
    if (o.kind == OpKind::Send) out += o.src.count;
    else if (is_message(o.kind)) in += o.dst.count;
  }
  return std::max(out, in);
}

namespace {

// Local rank j's intra lane of tick t: the all-gather of segment t-1, then the reduce-scatter of
// segment t+1 (built-in when CollArgs::intra_algorithm is empty), each in `chunks` pieces one after
// another. Raises scratch_end to its scratch.
std::vector<Step> intra_lane(const CollArgs& a, const Layout& y, int j, int t, int chunks, int64_t base,
                             int64_t& scratch_end, const OverlapShape& shape) {
  const std::string& rs_algo = shape.intra_rs.empty() ? a.intra_algorithm : shape.intra_rs;
  const std::string& ag_algo = shape.intra_ag.empty() ? a.intra_algorithm : shape.intra_ag;
  CollArgs aj = a;
  aj.rank = y.m.hosts[y.h][j];
  Layout yj = y.as_rank(aj);
  yj.chunks = chunks;
  std::vector<Step> lane;
  auto add = [&](std::vector<Step> steps) {
    for (Step& st : steps) lane.push_back(std::move(st));
  };
  for (int half = 0; half < 2; ++half) {
    const int phase = shape.rs_first ? 1 - half : half;  // 0: all-gather, 1: reduce-scatter
    const int seg = phase == 0 ? t - 1 : t + 1;
    if (seg < 0 || seg >= y.K) continue;
    for (yj.chunk = 0; yj.chunk < chunks; ++yj.chunk) {
      if (!rs_algo.empty()) {
        IntraPhases phases(yj, rs_algo, ag_algo, base);
        add(phase == 0 ? phases.ag(seg) : phases.rs(seg));
        scratch_end = std::max(scratch_end, phases.scratch_end());
      } else if (phase == 0) {
        Step x;
        yj.ag_comm(seg, x);
        if (!x.ops.empty()) lane.push_back(std::move(x));
      } else {
        add(yj.rs(seg));
      }
    }
  }
  return lane;
}

// Every local rank's intra lanes of tick t, aligned in rounds (align_rounds), which every local rank
// computes alike (the simulator, the verifier and auto's search build every rank's schedule, so
// each host's lanes of a tick were built L times): `talks`, the rounds in which some local rank
// sends or receives; `most`, each talking round's weight for merge_by_elements (the most elements
// any local rank sends or receives in it); `raised[j]`, what local rank j's lane raises its
// scratch_end to (INT64_MIN where nothing: scratch_end is each rank's own, in and out).
struct HostIntra {
  std::vector<std::vector<Step>> aligned;
  std::vector<bool> talks;
  std::vector<int64_t> most;
  std::vector<int64_t> raised;
};

HostIntra build_host_intra(const CollArgs& a, const Layout& y, int t, int chunks, int64_t base,
                           const OverlapShape& shape) {
  HostIntra out;
  std::vector<std::vector<Step>> lanes(y.L);
  out.raised.assign(y.L, std::numeric_limits<int64_t>::min());
  for (int j = 0; j < y.L; ++j) lanes[j] = intra_lane(a, y, j, t, chunks, base, out.raised[j], shape);
  out.aligned = align_rounds(y.m.hosts[y.h], lanes);
  out.talks.assign(out.aligned.empty() ? 0 : out.aligned[0].size(), false);
  std::vector<int64_t> most(out.talks.size(), 0);
  for (const auto& lane : out.aligned)
    for (size_t k = 0; k < lane.size(); ++k) {
      for (const Op& o : lane[k].ops) out.talks[k] = out.talks[k] || is_message(o.kind);
      most[k] = std::max(most[k], step_elements(lane[k]));
    }
  for (size_t k = 0; k < out.talks.size(); ++k)
    if (out.talks[k]) out.most.push_back(most[k]);
  return out;
}

// The memo of build_host_intra, per thread (the simulator, the verifier and the search may run on
// several threads; no state is shared). Its key is every input build_host_intra reads, spelled out
// (no hash of a struct that could miss a field):
//  - intra_lane builds local rank j's lane from aj = `a` with rank = hosts[h][j] and
//    yj = y.as_rank(aj) = Layout(aj, y.m, y.steady, y.ramp); Layout reads of aj only rank and count,
//    and of the map its hosts (host/local/L/H/max_L all follow from `hosts`): so `hosts`, `h`,
//    `count`, `steady` and `ramp` fix every yj (and y.K, y.L). The rank is not in the key: j runs
//    over the host's ranks whichever of them asks.
//  - the lane's segments and pieces: `t`, `chunks`; the registered phases' scratch: `base`.
//  - the algorithms: a.intra_algorithm and shape.intra_rs / intra_ag (the names), shape.rs_first
//    (the order); IntraPhases passes on_subgroup only yj's rank, the piece, the sub-group and the
//    name, and on_subgroup's build reads the registry: `generation` (it grows on every
//    registration and removal; builders are pure functions of their CollArgs, registry.h).
//  - align_rounds reads the lanes and hosts[h].
// Other CollArgs fields (inter_algorithm, segment, pieces, share, root, coll) reach the lanes only
// through y (steady, ramp) and `chunks`/`base`, which are in the key.
struct HostIntraKey {
  std::vector<std::vector<int>> hosts;
  int h = 0, steady = 0, ramp = 0;
  int64_t count = 0;
  std::string intra_algorithm, intra_rs, intra_ag;
  bool rs_first = false;
  uint64_t generation = 0;
};

struct HostIntraMemo {
  HostIntraKey key;  // the host and call; the entries below differ by tick, pieces and base
  struct Entry {
    int t, chunks;
    int64_t base;
    std::shared_ptr<const HostIntra> value;
  };
  std::vector<Entry> entries;
};

// A host's ticks: up to K + 2 ticks (K <= kMaxSegments plus a ramp's) at one or two piece counts.
constexpr size_t kMemoEntries = 256;
constexpr size_t kMemoCalls = 16;
std::atomic<bool> g_memo_on{true};

std::shared_ptr<const HostIntra> host_intra(const CollArgs& a, const Layout& y, int t, int chunks, int64_t base,
                                            const OverlapShape& shape) {
  if (!g_memo_on.load(std::memory_order_relaxed))
    return std::make_shared<const HostIntra>(build_host_intra(a, y, t, chunks, base, shape));
  // A few calls' memos, the latest first: rail_lanes builds each rank's W lanes (rail_halving on
  // shares of different counts) one after another before the next rank's.
  thread_local std::vector<HostIntraMemo> memos;
  const uint64_t generation = registry_generation();  // before the build, which reads the registry
  auto same = [&](const HostIntraKey& k) {  // compared in place: the key's hosts are copied only on a miss
    return k.h == y.h && k.steady == y.steady && k.ramp == y.ramp && k.count == a.count && k.rs_first == shape.rs_first &&
           k.generation == generation && k.intra_algorithm == a.intra_algorithm &&
           k.intra_rs == shape.intra_rs && k.intra_ag == shape.intra_ag && k.hosts == y.m.hosts;
  };
  auto find = [&] { return std::find_if(memos.begin(), memos.end(), [&](const HostIntraMemo& m) { return same(m.key); }); };
  if (auto at = find(); at != memos.end()) {
    std::rotate(memos.begin(), at, at + 1);
    for (const auto& e : memos.front().entries)
      if (e.t == t && e.chunks == chunks && e.base == base) return e.value;
  }
  // Built holding no reference into `memos`: a registered (Python) intra algorithm's builder may
  // build another overlapped schedule on this thread.
  auto value = std::make_shared<const HostIntra>(build_host_intra(a, y, t, chunks, base, shape));
  auto at = find();
  if (at == memos.end()) {
    if (memos.size() >= kMemoCalls) memos.pop_back();
    HostIntraMemo fresh;
    HostIntraKey& key = fresh.key;
    key.h = y.h, key.steady = y.steady, key.ramp = y.ramp, key.count = a.count, key.rs_first = shape.rs_first;
    key.generation = generation;
    key.intra_algorithm = a.intra_algorithm, key.intra_rs = shape.intra_rs, key.intra_ag = shape.intra_ag;
    key.hosts = y.m.hosts;
    at = memos.insert(memos.begin(), std::move(fresh));
  }
  if (at->entries.size() >= kMemoEntries) at->entries.clear();
  at->entries.push_back({t, chunks, base, value});
  return value;
}

}  // namespace

// This rank's intra lane of tick t from its host's aligned lanes (host_intra); raises `scratch_end`
// to cover it. With `round_elements`, each talking round's weight (HostIntra::most).
std::vector<Step> aligned_intra(const CollArgs& a, const Layout& y, int t, int chunks, int64_t base,
                                int64_t& scratch_end, std::vector<bool>& talks, const OverlapShape& shape,
                                std::vector<int64_t>* round_elements) {
  const std::shared_ptr<const HostIntra> host = host_intra(a, y, t, chunks, base, shape);
  scratch_end = std::max(scratch_end, host->raised[y.i]);
  talks = host->talks;
  if (round_elements) *round_elements = host->most;
  return host->aligned[y.i];
}

// (tests: off only to check that the memo changes nothing, _C.set_overlap_memo)
bool set_overlap_memo(bool on) { return g_memo_on.exchange(on); }

}  // namespace sched
}  // namespace commlib
