// Which stores a `shared` broadcast's root writes its stream with (host/flag_calls.cc): plain ones,
// which leave the ring in cache, or non-temporal ones, which write whole lines to memory.
//
// Plain stores suit readers on the root's core: they copy the bytes out of its cache. Readers on
// another core read every ring line, so when the root comes round to a line again it must first
// take it back from their caches, line by line: with 4 ranks on 2 cores, root and one reader on
// one core and two readers on the other (`bench/small_call_ranks.py broadcast --pin`), an 8 MiB
// broadcast cost the root 2.4-3.1 ms on a core a call instead of 0.35 (all on one core), its
// readers yielded ~400 times a call waiting for it, and every size from 128 KiB paid 3-5x; with
// non-temporal stores the root spent 0.48-0.52 ms and nobody yielded, while all on one core they
// cost 18-30% more than plain ones (bench/RESULTS_collectives.md, session 22). Where the scheduler
// puts the ranks is not the root's to see, and it changes, so the root measures how long its pieces
// take (time per byte, the fastest piece of each kind in a call, so that a preemption mid-piece does
// not count): plain stores measured 0.028-0.032 ns a byte on one core and 0.33-0.35 spread out,
// non-temporal ones 0.030-0.033 either way. It writes non-temporal only where plain ones cost
// kMargin times more (the readers on its core gain from plain stores what the root's own time does
// not show), and keeps both measures fresh by writing one piece of the other kind every
// kProbeEvery calls (and each kind once at first).
#pragma once

#include <algorithm>
#include <cstdint>
#include <limits>

namespace commlib {

class RingStores {
 public:
  static constexpr uint64_t kProbeEvery = 16;
  static constexpr double kMargin = 2.0;

  void begin_call() {
    ++calls_;
    pieces_ = 0;
    fastest_[0] = fastest_[1] = kNone;
  }
  // The kind of the call's next piece: true = non-temporal.
  bool next_piece() {
    const bool best = cost_[0] > 0 && cost_[1] > 0 && cost_[0] > kMargin * cost_[1];
    bool kind = best;
    if (pieces_++ == 0) {  // the call's first piece measures a kind not measured yet, or probes
      if (cost_[0] == 0)
        kind = false;
      else if (cost_[1] == 0)
        kind = true;
      else if (calls_ % kProbeEvery == 0)
        kind = !best;
    }
    last_ = kind;
    return kind;
  }
  // The piece next_piece() chose for took `ns` for `bytes`.
  void piece(uint64_t bytes, double ns) {
    if (bytes) fastest_[last_] = std::min(fastest_[last_], ns / static_cast<double>(bytes));
  }
  void end_call() {
    for (int k = 0; k < 2; ++k)
      if (fastest_[k] < kNone) cost_[k] = fastest_[k];
  }
  // The last measure of a kind in ns per byte (0: none yet).
  double cost(bool streaming) const { return cost_[streaming]; }

 private:
  static constexpr double kNone = std::numeric_limits<double>::infinity();
  double cost_[2] = {0, 0};
  double fastest_[2] = {kNone, kNone};
  uint64_t calls_ = 0;
  uint64_t pieces_ = 0;
  bool last_ = false;
};

}  // namespace commlib
