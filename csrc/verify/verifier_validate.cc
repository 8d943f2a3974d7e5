// The replay's static checks (verifier_replay.h): every op of every step in bounds of a buffer
// its rank owns, valid peers, and the ops of a step independent (no two write, or read and write,
// overlapping elements). Several messages of one pair in a step are allowed: they match in op order
// (ir.h), which the play (verifier_play.cc) proves with the values they carry.
#include "verify/verifier_replay.h"

#include <algorithm>

namespace commlib {
namespace verify {

void Replay::setup_rank(int r) {
  Rank& R = ranks_[r];
  if (sch_[r].scratch_count < 0) fail("rank " + std::to_string(r) + " has negative scratch_count");
  R.L = make_layout(c_, P_, r, root_, n_, sch_[r].scratch_count, in_place_);
  R.mem.init(R.L.arena);
  const int I = static_cast<int>(BufferId::Input);
  if (R.L.size[I] > 0) R.mem.set(R.L.base[I], R.L.size[I], 0, sets_.single(r), leaf_tree(r));
  R.know = R.know_at_entry = sets_.single(r);
  R.recv_from.assign(P_, -1);
  R.send_to.assign(P_, -1);
}

void Replay::check_region(int r, size_t st, int oi, const Region& g, bool write, int owner) {
  const int q = owner < 0 ? r : owner;
  const std::string whose = owner < 0 ? "" : "rank " + std::to_string(q) + "'s ";
  const Layout& L = ranks_[q].L;
  const int b = static_cast<int>(g.buf);
  if (b < 0 || b > 2) fail(where(r, st, oi) + ": bad buffer id");
  if (L.size[b] < 0)
    fail(where(r, st, oi) + ": references " + whose + buffer_name(g.buf) + ", which rank " + std::to_string(q) +
         " does not own in " + collective_name(c_));
  if (write && g.buf == BufferId::Input)
    fail(where(r, st, oi) + ": writes " + (owner < 0 ? std::string("the ") : whose) + "input buffer");
  if (g.offset < 0 || g.count < 0 || g.offset + g.count > L.size[b])
    fail(where(r, st, oi) + ": region out of bounds (" + whose + buffer_name(g.buf) + " has " +
         std::to_string(L.size[b]) + " elements)");
}

void Replay::validate_rank(int r) {
  const auto& steps = sch_[r].steps;

  for (size_t st = 0; st < steps.size(); ++st) {
    const auto& ops = steps[st].ops;
    writes_.clear();
    reads_.clear();
    for (int oi = 0; oi < static_cast<int>(ops.size()); ++oi) {
      const Op& o = ops[oi];
      if (names_peer(o.kind))
        if (o.peer < 0 || o.peer >= P_ || o.peer == r)
          fail(where(r, st, oi) + ": bad peer " + std::to_string(o.peer));
      if (is_sync(o.kind) && (o.tag < 0 || o.tag >= kSignalTags))
        fail(where(r, st, oi) + ": tag " + std::to_string(o.tag) + " out of range [0, " +
             std::to_string(kSignalTags) + ")");
      // The peer's side of a get (its source) or a put (its destination).
      const bool remote_src = o.kind == OpKind::Get || o.kind == OpKind::GetReduce, remote_dst = o.kind == OpKind::Put;
      if (remote_src || remote_dst) {
        check_region(r, st, oi, remote_src ? o.src : o.dst, remote_dst, o.peer);
        if (o.src.count != o.dst.count)
          fail(where(r, st, oi) + ": source and destination counts differ");
      }
      if (reads_every_rank(o.kind)) {  // every peer's src (and reduce_to_all's dst) too, in the peer's layout
        if (o.src.count != o.dst.count) fail(where(r, st, oi) + ": source and destination counts differ");
        for (int q = 0; q < P_; ++q)
          if (q != r) {
            check_region(r, st, oi, o.src, false, q);
            if (o.kind == OpKind::ReduceToAll) check_region(r, st, oi, o.dst, true, q);
          }
      }
      const bool has_dst = op_has_dst(o) && !remote_dst, has_src = op_has_src(o) && !remote_src;
      if (has_dst) check_region(r, st, oi, o.dst, true);
      if (has_src) check_region(r, st, oi, o.src, false);
      if (reduces_from_src(o) && o.src.count != o.dst.count)
        fail(where(r, st, oi) + ": reduces " + std::to_string(o.src.count) + " source elements into " +
             std::to_string(o.dst.count));
      if (noop_copy(r, o)) continue;
      if ((reduces_from_src(o) || reads_every_rank(o.kind)) && abs(r, o.src) == abs(r, o.dst)) {
        // in place: a plain recv_reduce; a reduce_to_all (from_all) reading and writing the same elements
        if (o.dst.count > 0) writes_.push_back(Iv{abs(r, o.dst), abs(r, o.dst) + o.dst.count, oi});
        continue;
      }
      if (has_dst && o.dst.count > 0) {
        const int64_t a = abs(r, o.dst);
        writes_.push_back(Iv{a, a + o.dst.count, oi});
      }
      if (has_src && o.src.count > 0) {
        const int64_t a = abs(r, o.src);
        reads_.push_back(Iv{a, a + o.src.count, oi});
      }
    }
    check_independent(r, st);
  }
}

void Replay::conflict(int r, size_t st, int a, int b, const char* kind) {
  if (a == b)
    fail(where(r, st, a) + ": its source and destination overlap" + (in_place_ ? " (in-place aliasing)" : ""));
  fail("rank " + std::to_string(r) + " step " + std::to_string(st) + ": ops " + std::to_string(a) + " " +
       opdesc(sch_[r].steps[st].ops[a]) + " and " + std::to_string(b) + " " +
       opdesc(sch_[r].steps[st].ops[b]) + " are not independent (" + kind + " overlap" +
       (in_place_ ? ", in-place aliasing" : "") + ")");
}

void Replay::check_independent(int r, size_t st) {
  if (writes_.empty()) return;
  std::sort(writes_.begin(), writes_.end(), [](const Iv& x, const Iv& y) { return x.start < y.start; });
  for (size_t i = 1; i < writes_.size(); ++i)
    if (writes_[i].start < writes_[i - 1].end) conflict(r, st, writes_[i - 1].op, writes_[i].op, "write/write");
  for (const Iv& rd : reads_) {
    // writes_ are disjoint and sorted, so their ends are sorted too.
    auto it = std::upper_bound(writes_.begin(), writes_.end(), rd.start,
                               [](int64_t v, const Iv& w) { return v < w.end; });
    // An op whose source overlaps its own destination is reported too (conflict(a, a)).
    if (it != writes_.end() && it->start < rd.end) conflict(r, st, it->op, rd.op, "read/write");
  }
}

}  // namespace verify
}  // namespace commlib
