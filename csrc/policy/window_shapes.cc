// rail_window's shapes (window_shapes.h).
#include "policy/window_shapes.h"

#include <cstdint>
#include <utility>

#include "schedule/registry.h"

namespace commlib {

// rail_window's shapes (schedule/rail_window.cc): K segments, each a lane, under a window of D steps
// (pieces; 0: one segment's steps, n), stagger 1. Its lanes overlap as rail_lanes' do, so each is
// simulated. Session 25 (docs/simulator.md "A window of steps in flight"): at 64 MiB on 16 and 128
// dgx-h100 nodes 64 and 128 segments win (128 nodes: K 128, D 2n 364.6 GB/s, K 64 D n 359.8, K 32
// D n 339.7), the window matters by 1-2 %; fewer segments leave a segment's own chain exposed. From
// 4096 ranks one shape (a run there takes minutes): K 64, D n, since session 27 ramped (share's ramp
// R 2, schedule/rail_window.cc: the end segments in quarters and a half; 1024 nodes 64 MiB 351.2
// GB/s against 347.8 equal, the same run's cost). Below 4096 ranks the ramp does not win with the
// ring inside the hosts (128 nodes, 64 MiB: K 128 R 2 363.4 against 363.7 equal, K 96 R 2 362.3, K 64
// R 2 358.9; docs/simulator.md "Session 27").
// Session 29: below 4096 ranks a fifth shape, tried first, K 128 under a window of 2n with the ramp R 2 and each
// segment's intra-host phases by the direct exchange (one round each way, rail_window's `intra`):
// 128 nodes, 64 MiB, 365.9 us (366.4 GB/s) against 368.6 (363.7) for the ring's K 128 D 2n
// (docs/simulator.md "Session 29"). From 4096 ranks the one shape is unchanged (1024 nodes, 64 MiB:
// direct 388.7 us against the ring's 382.1).
// Session 32: below 4096 ranks a sixth shape, tried first, K 128 under a window of 5n/2 with the
// ramp R 2, direct intra phases and an intra window of 3 (share >> 24: at most 3 of a rank's steps
// inside the host in flight, the oldest first, ir.h Schedule::intra_window): 128 nodes, 64 MiB,
// 360.0 us (372.4 GB/s) against 365.9 for the session-29 shape; without the intra window the wider
// window queued the ports (371.8 us) (docs/simulator.md "Session 32").
// Session 33: from 4096 ranks the one shape is K 64 under a window of 5n, ramped (R 2), direct intra
// phases and an intra window of 2: 1024 nodes, 64 MiB, 361.2 us (371.5 GB/s; D 2n 374.8, 3n 371.7,
// 4n 365.5, 6n 361.4, 8n 361.6) against the ring's K 64 D n R 2 above, 382.1 (351.2). Session 32's best
// there, K 128 D 2n with the same intra phases, 372.5 us (360.3), costs twice a run (auto's search at
// 4096 ranks, 64 MiB +28 %): a rank posts twice the messages between hosts, 71 % of its CPU
// (docs/simulator.md "Session 33").
constexpr int kHugeRamp = 2;

struct WindowShape {
  int K;
  int halves;         // the window in halves of one segment's steps n (2: n, 4: 2n, 5: 5n/2)
  int ramp;           // share's R
  const char* intra;  // the segments' intra-host phases ("": the ring)
  int intra_window;   // share's E (0: none)
};

std::vector<Composition> window_shapes(const CallShape& call, const Composition& cand, const sim::Topology& t) {
  std::vector<Composition> out;
  const bool huge = t.size() >= 4096;
  static const std::vector<WindowShape> kHuge{{64, 10, kHugeRamp, "direct", 2}};
  static const std::vector<WindowShape> kShapes{{128, 5, 2, "direct", 3}, {128, 4, 2, "direct", 0}, {64, 2, 0, "", 0},
                                                {128, 4, 0, "", 0},       {128, 2, 0, "", 0},        {32, 2, 0, "", 0}};
  for (const WindowShape& w : huge ? kHuge : kShapes) {
    const int64_t segment = call.count / w.K;
    if (segment < 2 * static_cast<int64_t>(t.size())) continue;  // (the builder's one-lane fallback)
    Composition k = cand;
    k.segment = segment, k.pieces = 0, k.share = w.intra_window << 24 | w.ramp << 16, k.intra = w.intra;
    if (w.halves != 2) {  // the builder's window with pieces 0 (one segment's steps), scaled
      CollArgs a = call.args_on(t.host_of);
      a.compose(k);
      k.pieces = w.halves * build_schedule(a, k).window / 2;
    }
    out.push_back(k);
  }
  return out;
}


}  // namespace commlib
