// The symbolic verifier's run (verifier.h): validates every rank's steps, plays them with
// rendezvous matching on symbolic values (verifier_values.h) in each rank's arena
// (verifier_layout.h), and checks the outputs. Contributor sets are interned interval lists
// (verifier_sets.h), so world sizes are bounded by time, not by a mask width.
#include "engine/verifier.h"

#include <algorithm>
#include <sstream>

#include "engine/verifier_layout.h"
#include "engine/verifier_values.h"
#include "engine/auto_policy.h"
#include "schedule/registry.h"

namespace commlib {

namespace {

using verify::Layout;
using verify::Mem;
using verify::RankSets;
using verify::Run;
using verify::SetId;
using verify::Val;
using verify::kUninit;
using verify::leaf_tree;
using verify::make_layout;
using verify::push_merge;
using verify::src_at;

struct Iv {
  int64_t start, end;
  int op;
};

class Sim {
 public:
  Sim(Collective c, const std::vector<Schedule>& sch, int P, int64_t n, int root, bool in_place,
      const std::string& label)
      : c_(c), sch_(sch), P_(P), n_(n), root_(root), in_place_(in_place), sets_(P) {
    std::ostringstream h;
    h << collective_name(c) << "/" << label << " size=" << P << " count=" << n;
    if (collective_has_root(c)) h << " root=" << root;
    h << (in_place ? " in-place" : " out-of-place");
    head_ = h.str();
  }

  void run() {
    if (static_cast<int>(sch_.size()) != P_)
      fail("expected " + std::to_string(P_) + " schedules, got " + std::to_string(sch_.size()));
    all_ = sets_.all();
    ranks_.resize(P_);
    for (int r = 0; r < P_; ++r) setup_rank(r);
    for (int r = 0; r < P_; ++r) validate_rank(r);
    simulate();
    check_results();
  }

 private:
  struct Rank {
    Layout L;
    Mem mem;
    size_t step = 0;
    int pending = 0;
    bool done = false;
    SetId know = RankSets::kEmpty, know_at_entry = RankSets::kEmpty;
    std::vector<int> recv_from, send_to;  // op index in the current step, -1 if none
    std::vector<char> matched;
  };

  [[noreturn]] void fail(const std::string& what) const { throw VerificationError(head_ + ": " + what); }

  std::string reg(const Region& g) const {
    return std::string(buffer_name(g.buf)) + "[" + std::to_string(g.offset) + ":" +
           std::to_string(g.offset + g.count) + "]";
  }
  std::string opdesc(const Op& o) const {
    std::string s = op_kind_name(o.kind);
    switch (o.kind) {
      case OpKind::Send: return s + "(to " + std::to_string(o.peer) + ", " + reg(o.src) + ")";
      case OpKind::Recv:
      case OpKind::RecvReduce:
        return s + "(from " + std::to_string(o.peer) + ", " + reg(o.dst) +
               (reduces_from_src(o) ? " <- " + reg(o.src) : std::string()) + ")";
      default: return s + "(" + reg(o.dst) + " <- " + reg(o.src) + ")";
    }
  }
  std::string where(int r, size_t st, int oi) const {
    return "rank " + std::to_string(r) + " step " + std::to_string(st) + " op " + std::to_string(oi) +
           " " + opdesc(sch_[r].steps[st].ops[oi]);
  }

  void setup_rank(int r) {
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

  void check_region(int r, size_t st, int oi, const Region& g, bool write) {
    const Layout& L = ranks_[r].L;
    const int b = static_cast<int>(g.buf);
    if (b < 0 || b > 2) fail(where(r, st, oi) + ": bad buffer id");
    if (L.size[b] < 0)
      fail(where(r, st, oi) + ": references " + buffer_name(g.buf) + ", which rank " + std::to_string(r) +
           " does not own in " + collective_name(c_));
    if (write && g.buf == BufferId::Input) fail(where(r, st, oi) + ": writes the input buffer");
    if (g.offset < 0 || g.count < 0 || g.offset + g.count > L.size[b])
      fail(where(r, st, oi) + ": region out of bounds (" + buffer_name(g.buf) + " has " +
           std::to_string(L.size[b]) + " elements)");
  }
  int64_t abs(int r, const Region& g) const {
    return ranks_[r].L.base[static_cast<int>(g.buf)] + g.offset;
  }
  bool noop_copy(int r, const Op& o) const {
    return o.kind == OpKind::Copy && o.dst.count == o.src.count && abs(r, o.dst) == abs(r, o.src);
  }

  void validate_rank(int r) {
    const auto& steps = sch_[r].steps;
    std::vector<int> seen_send(P_, -1), seen_recv(P_, -1);
    for (size_t st = 0; st < steps.size(); ++st) {
      const auto& ops = steps[st].ops;
      writes_.clear();
      reads_.clear();
      for (int oi = 0; oi < static_cast<int>(ops.size()); ++oi) {
        const Op& o = ops[oi];
        const bool comm = o.kind == OpKind::Send || o.kind == OpKind::Recv || o.kind == OpKind::RecvReduce;
        if (comm) {
          if (o.peer < 0 || o.peer >= P_ || o.peer == r)
            fail(where(r, st, oi) + ": bad peer " + std::to_string(o.peer));
          auto& seen = o.kind == OpKind::Send ? seen_send : seen_recv;
          if (seen[o.peer] == static_cast<int>(st))
            fail(where(r, st, oi) + ": a second " + (o.kind == OpKind::Send ? "send to" : "receive from") +
                 " rank " + std::to_string(o.peer) + " in one step");
          seen[o.peer] = static_cast<int>(st);
        }
        const bool has_dst = o.kind != OpKind::Send,
                   has_src = o.kind == OpKind::Send || o.kind == OpKind::Copy || o.kind == OpKind::Reduce ||
                             reduces_from_src(o);
        if (has_dst) check_region(r, st, oi, o.dst, true);
        if (has_src) check_region(r, st, oi, o.src, false);
        if (reduces_from_src(o) && o.src.count != o.dst.count)
          fail(where(r, st, oi) + ": reduces " + std::to_string(o.src.count) + " source elements into " +
               std::to_string(o.dst.count));
        if (noop_copy(r, o)) continue;
        if (reduces_from_src(o) && abs(r, o.src) == abs(r, o.dst)) {  // in place: a plain recv_reduce
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

  void conflict(int r, size_t st, int a, int b, const char* kind) {
    if (a == b)
      fail(where(r, st, a) + ": its source and destination overlap" + (in_place_ ? " (in-place aliasing)" : ""));
    fail("rank " + std::to_string(r) + " step " + std::to_string(st) + ": ops " + std::to_string(a) + " " +
         opdesc(sch_[r].steps[st].ops[a]) + " and " + std::to_string(b) + " " +
         opdesc(sch_[r].steps[st].ops[b]) + " are not independent (" + kind + " overlap" +
         (in_place_ ? ", in-place aliasing" : "") + ")");
  }

  void check_independent(int r, size_t st) {
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

  // ---- simulation ----
  void enter_step(int r) {
    Rank& R = ranks_[r];
    for (;;) {
      if (R.step >= sch_[r].steps.size()) {
        R.done = true;
        return;
      }
      const auto& ops = sch_[r].steps[R.step].ops;
      R.matched.assign(ops.size(), 0);
      R.pending = 0;
      R.know_at_entry = R.know;
      for (int oi = 0; oi < static_cast<int>(ops.size()); ++oi) {
        const Op& o = ops[oi];
        if (o.kind == OpKind::Send) {
          R.send_to[o.peer] = oi;
          ++R.pending;
        } else if (o.kind == OpKind::Recv || o.kind == OpKind::RecvReduce) {
          R.recv_from[o.peer] = oi;
          ++R.pending;
        }
      }
      for (int oi = 0; oi < static_cast<int>(ops.size()); ++oi) {
        const Op& o = ops[oi];
        if (R.matched[oi]) continue;
        if (o.kind == OpKind::Send) try_match(r, oi, o.peer);
        else if (o.kind == OpKind::Recv || o.kind == OpKind::RecvReduce) try_match_recv(r, oi, o.peer);
      }
      if (R.pending > 0) return;
      finish_step(r);
    }
  }

  // Sender s (op si) with receiver q's current step.
  void try_match(int s, int si, int q) {
    Rank& Q = ranks_[q];
    if (Q.done) return;
    const int qi = Q.recv_from[s];
    if (qi < 0 || Q.matched[qi]) return;
    transfer(s, si, q, qi);
  }
  void try_match_recv(int q, int qi, int s) {
    Rank& S = ranks_[s];
    if (S.done) return;
    const int si = S.send_to[q];
    if (si < 0 || S.matched[si]) return;
    transfer(s, si, q, qi);
  }

  void transfer(int s, int si, int q, int qi) {
    Rank& S = ranks_[s];
    Rank& Q = ranks_[q];
    const Op& so = sch_[s].steps[S.step].ops[si];
    const Op& ro = sch_[q].steps[Q.step].ops[qi];
    if (so.src.count != ro.dst.count)
      fail(where(s, S.step, si) + " sends " + std::to_string(so.src.count) + " elements but " +
           where(q, Q.step, qi) + " receives " + std::to_string(ro.dst.count));
    const int64_t n = so.src.count;
    S.mem.read(abs(s, so.src), n, pa_);
    if (ro.kind == OpKind::Recv) {
      Q.mem.write(abs(q, ro.dst), n, pa_);
    } else {
      Q.mem.read(abs(q, reduces_from_src(ro) ? ro.src : ro.dst), n, pb_);
      verify::combine_pieces(sets_, pb_, pa_, pc_);
      Q.mem.write(abs(q, ro.dst), n, pc_);
    }
    // Who-heard-from-whom matters only for barriers; tracking it elsewhere would intern ~P^2 sets.
    if (c_ == Collective::Barrier) Q.know = sets_.unite(Q.know, S.know_at_entry);
    S.matched[si] = 1;
    Q.matched[qi] = 1;
    if (--S.pending == 0) ready_.push_back(s);
    if (--Q.pending == 0) ready_.push_back(q);
  }

  void finish_step(int r) {
    Rank& R = ranks_[r];
    const auto& ops = sch_[r].steps[R.step].ops;
    for (const Op& o : ops) {
      if (o.kind == OpKind::Copy) {
        if (noop_copy(r, o)) continue;
        R.mem.read(abs(r, o.src), o.src.count, pa_);
        R.mem.write(abs(r, o.dst), o.dst.count, pa_);
      } else if (o.kind == OpKind::Reduce) {
        R.mem.read(abs(r, o.src), o.src.count, pa_);
        R.mem.read(abs(r, o.dst), o.dst.count, pb_);
        verify::combine_pieces(sets_, pb_, pa_, pc_);
        R.mem.write(abs(r, o.dst), o.dst.count, pc_);
      }
    }
    for (const Op& o : ops) {
      if (o.kind == OpKind::Send) R.send_to[o.peer] = -1;
      else if (o.kind == OpKind::Recv || o.kind == OpKind::RecvReduce) R.recv_from[o.peer] = -1;
    }
    ++R.step;
  }

  void simulate() {
    // Copy count checks up front (cheap, clearer message than a later mismatch).
    for (int r = 0; r < P_; ++r)
      for (size_t st = 0; st < sch_[r].steps.size(); ++st)
        for (int oi = 0; oi < static_cast<int>(sch_[r].steps[st].ops.size()); ++oi) {
          const Op& o = sch_[r].steps[st].ops[oi];
          if ((o.kind == OpKind::Copy || o.kind == OpKind::Reduce) && o.src.count != o.dst.count)
            fail(where(r, st, oi) + ": source and destination counts differ");
        }
    for (int r = 0; r < P_; ++r) enter_step(r);
    while (!ready_.empty()) {
      const int r = ready_.back();
      ready_.pop_back();
      Rank& R = ranks_[r];
      if (R.done || R.pending != 0) continue;
      finish_step(r);
      enter_step(r);
    }
    for (int r = 0; r < P_; ++r) {
      const Rank& R = ranks_[r];
      if (R.done) continue;
      const auto& ops = sch_[r].steps[R.step].ops;
      std::string msg = "deadlock: rank " + std::to_string(r) + " stuck in step " + std::to_string(R.step) +
                        " waiting for";
      for (int oi = 0; oi < static_cast<int>(ops.size()); ++oi) {
        const Op& o = ops[oi];
        if (R.matched[oi] || !(o.kind == OpKind::Send || o.kind == OpKind::Recv || o.kind == OpKind::RecvReduce))
          continue;
        const Rank& Q = ranks_[o.peer];
        msg += std::string(" ") + (o.kind == OpKind::Send ? "send to" : "receive from") + " rank " +
               std::to_string(o.peer) + " (" +
               (Q.done ? std::string("which has finished")
                       : "which is in step " + std::to_string(Q.step)) +
               ")";
        break;
      }
      fail(msg);
    }
  }

  // ---- results ----
  void check_results() {
    const int O = static_cast<int>(BufferId::Output);
    for (int r = 0; r < P_; ++r) {
      const Rank& R = ranks_[r];
      if (c_ == Collective::Barrier) {
        if (R.know != all_)
          fail("rank " + std::to_string(r) + " leaves the barrier having heard (directly or not) only from ranks " +
               sets_.str(R.know) + ", expected " + sets_.str(all_));
        continue;
      }
      if (R.L.size[O] < 0) continue;
      const int64_t m = R.L.size[O];
      R.mem.read(R.L.base[O], m, pa_);
      expected(r, pb_);
      size_t i = 0, j = 0;
      int64_t pos = 0;
      while (i < pa_.size() && j < pb_.size()) {
        const Run& g = pa_[i];
        const Run& e = pb_[j];
        const int64_t end = std::min(g.start + g.len, e.start + e.len);
        const Val gv{src_at(g, pos), g.set}, ev{src_at(e, pos), e.set};
        if (gv.src != ev.src || gv.set != ev.set)
          fail("rank " + std::to_string(r) + " output[" + std::to_string(pos) + "]: expected " +
               verify::val_str(sets_, ev, "input") + ", got " + verify::val_str(sets_, gv, "input"));
        pos = end;
        if (g.start + g.len == end) ++i;
        if (e.start + e.len == end) ++j;
      }
    }
    if (c_ == Collective::AllReduce) check_same_order();
  }

  // Every rank must have reduced each element in the same order (same tree up to commutativity).
  void check_same_order() {
    const int O = static_cast<int>(BufferId::Output);
    ranks_[0].mem.read(ranks_[0].L.base[O], ranks_[0].L.size[O], pc_);
    for (int r = 1; r < P_; ++r) {
      ranks_[r].mem.read(ranks_[r].L.base[O], ranks_[r].L.size[O], pa_);
      size_t i = 0, j = 0;
      int64_t pos = 0;
      while (i < pa_.size() && j < pc_.size()) {
        const Run& g = pa_[i];
        const Run& e = pc_[j];
        const int64_t end = std::min(g.start + g.len, e.start + e.len);
        if (g.tree != e.tree)
          fail("rank " + std::to_string(r) + " output[" + std::to_string(pos) +
               "] was reduced in a different order than on rank 0, so the ranks would not end bitwise "
               "identical");
        pos = end;
        if (g.start + g.len == end) ++i;
        if (e.start + e.len == end) ++j;
      }
    }
  }

  // Expected output of rank r as pieces.
  void expected(int r, std::vector<Run>& out) {
    const int64_t n = n_, rn = static_cast<int64_t>(r) * n_;
    out.clear();
    switch (c_) {
      case Collective::AllReduce:
      case Collective::Reduce: push_merge(out, Run{0, n, 0, all_, 0}); break;
      case Collective::ReduceScatter: push_merge(out, Run{0, n, rn, all_, 0}); break;
      case Collective::AllGather:
      case Collective::Gather:
        for (int j = 0; j < P_; ++j) push_merge(out, Run{j * n, n, 0, sets_.single(j), 0});
        break;
      case Collective::AllToAll:
        for (int j = 0; j < P_; ++j) push_merge(out, Run{j * n, n, rn, sets_.single(j), 0});
        break;
      case Collective::Broadcast: push_merge(out, Run{0, n, 0, sets_.single(root_), 0}); break;
      case Collective::Scatter: push_merge(out, Run{0, n, rn, sets_.single(root_), 0}); break;
      default: break;
    }
  }

  Collective c_;
  const std::vector<Schedule>& sch_;
  int P_;
  int64_t n_;
  int root_;
  bool in_place_;
  std::string head_;
  RankSets sets_;
  SetId all_ = RankSets::kEmpty;
  std::vector<Rank> ranks_;
  std::vector<int> ready_;
  std::vector<Iv> writes_, reads_;
  std::vector<Run> pa_, pb_, pc_;
};

// Bounded by run time and memory (a ring at P ranks plays ~2P^2 transfers), not by representation.
void check_size(int size) {
  if (size < 1 || size > kMaxVerifiedRanks)
    throw std::invalid_argument("size: the verifier supports 1.." + std::to_string(kMaxVerifiedRanks) +
                                " ranks, got " + std::to_string(size));
}

}  // namespace

bool collective_has_in_place(Collective c) {
  return c != Collective::AllToAll && c != Collective::Barrier && c != Collective::Send &&
         c != Collective::Recv;
}

void verify_schedules(Collective c, const std::vector<Schedule>& per_rank, int size, int64_t count, int root,
                      bool in_place, const std::string& label) {
  check_size(size);
  if (count < 0) throw std::invalid_argument("count: must be >= 0, got " + std::to_string(count));
  if (collective_has_root(c) && (root < 0 || root >= size))
    throw std::invalid_argument("root: " + std::to_string(root) + " out of range [0, " + std::to_string(size) + ")");
  if (c == Collective::Send || c == Collective::Recv || c == Collective::kCount)
    throw std::invalid_argument(std::string("collective: ") + collective_name(c) + " has no schedules");
  if (!collective_has_root(c)) root = 0;
  Sim sim(c, per_rank, size, count, root, in_place, label);
  sim.run();
}

std::string verify_algorithm(Collective c, const std::string& algorithm, int size, int64_t count, int root,
                             DType dtype) {
  check_size(size);
  std::vector<Schedule> per_rank(size);
  CollArgs a;
  a.coll = c;
  a.size = size;
  a.count = count;
  a.root = collective_has_root(c) ? root : 0;
  std::string name = algorithm;
  if (name == "auto") name = choose_algorithm(c, name, count * static_cast<int64_t>(dtype_size(dtype)), size);
  for (int r = 0; r < size; ++r) {
    a.rank = r;
    per_rank[r] = build_schedule(a, name);
  }
  verify_schedules(c, per_rank, size, count, a.root, false, name);
  if (collective_has_in_place(c)) verify_schedules(c, per_rank, size, count, a.root, true, name);
  return name;
}

}  // namespace commlib
