// The event run (simulator.h; the Run class: run.h).
#include "sim/simulator.h"

#include <algorithm>
#include <chrono>
#include <memory>
#include <cmath>
#include <stdexcept>
#include <vector>

#include "schedule/registry.h"
#include "sim/compact.h"
#include "sim/rates.h"
#include "sim/run.h"

namespace commlib {
namespace sim {

namespace {

double now_s() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

}  // namespace

Result simulate(Collective c, const Composition& how, int64_t count, int elem_bytes, int root,
                const Topology& topo, const Options& opts) {
  check_call(c, count, elem_bytes, root, topo);
  if (how.segment < 0) throw std::invalid_argument("segment: must be >= 0, got " + std::to_string(how.segment));
  const int P = topo.size();
  if (!collective_has_root(c)) root = 0;
  Result res;
  const double t0 = now_s();
  const std::shared_ptr<const BuiltPrograms> built = built_programs(c, how, P, count, root, topo.host_of, &res.built_cached);
  const ShapeTable& shapes = built->shapes;
  const double t1 = now_s();
  const std::vector<RankRates> rates = rank_rates(topo, c, count, elem_bytes, root, built->scratch, res);
  if (opts.trace) start_trace(*opts.trace, topo);
  // Lanes (schedule/lanes.h) play as players of their own, the rank's lanes in flight, as both the
  // GPU presets' NCCL-like engines and, since session 26, commlib's host executor run them
  // (docs/DESIGN.md "Laned calls"); on a CPU host the rank's one progress thread is shared by its
  // lanes (run.h, on_core). A compressed call runs step by step in the host executor (list order),
  // so a coded laned call on a CPU host's model plays its list in order.
  const std::vector<Program>* programs = &built->programs;
  std::vector<Program> listed;
  int lanes = built->lanes;
  if (lanes > 1 && !topo.intra_by_device && opts.codec.active) {
    listed.resize(P);
    std::vector<std::pair<size_t, uint32_t>> at(lanes);  // per lane: its program's run, steps taken of it
    for (int r = 0; r < P; ++r) {
      std::fill(at.begin(), at.end(), std::make_pair(size_t{0}, 0u));
      for (const uint16_t c : built->order[r]) {  // the list's steps, each from its lane's program
        const Program& lane = built->programs[static_cast<size_t>(r) * lanes + c];
        auto& [run, taken] = at[c];
        const uint32_t shape = lane[run].first;
        if (++taken == lane[run].second) ++run, taken = 0;
        if (!listed[r].empty() && listed[r].back().first == shape) ++listed[r].back().second;
        else listed[r].emplace_back(shape, 1u);
      }
    }
    programs = &listed;
    lanes = 1;
  }
  // A window (ir.h Schedule::window) bounds the lanes' steps in flight; in list order it changes nothing.
  // So does the intra window (Schedule::intra_window), which needs the window's list order.
  const bool windowed = lanes > 1 && (built->window > 0 || std::any_of(built->gates.begin(), built->gates.end(),
                                                                        [](const std::vector<int>& g) { return !g.empty(); }));
  detail::Run run(topo, rates, shapes, *programs, elem_bytes, opts.trace, opts.codec, lanes,
                  windowed ? &built->order : nullptr, built->window, windowed ? &built->gates : nullptr);
  run.play(res, opts.stop_after_s);
  res.build_s = t1 - t0;
  res.run_s = now_s() - t1;
  res.shapes = static_cast<int64_t>(shapes.size());
  return res;
}

}  // namespace sim
}  // namespace commlib

