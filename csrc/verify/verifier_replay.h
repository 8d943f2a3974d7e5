// The verifier's replay of one collective's schedules (verifier.h's verify_schedules): every rank's
// steps validated (verifier_validate.cc), played with rendezvous matching on symbolic values
// (verifier_play.cc), and the outputs checked against what the collective must produce
// (verifier_results.cc). Values live in each rank's arena (verifier_layout.h) as runs of
// contributor sets (verifier_values.h, verifier_sets.h).
#pragma once

#include <cstdint>
#include <sstream>
#include <string>
#include <unordered_map>
#include <vector>

#include "schedule/player.h"
#include "verify/verifier.h"
#include "verify/verifier_hazards.h"
#include "verify/verifier_layout.h"
#include "verify/verifier_values.h"

namespace commlib {
namespace verify {

struct Iv {  // an interval of a rank's arena touched by op `op` of a step
  int64_t start, end;
  int op;
};

class Replay {
 public:
  Replay(Collective c, const std::vector<Schedule>& sch, int P, int64_t n, int root, bool in_place,
         const std::string& label)
      : c_(c), sch_(sch), P_(P), n_(n), root_(root), in_place_(in_place), sets_(P), player_(*this) {
    std::ostringstream h;
    h << collective_name(c) << "/" << label << " size=" << P << " count=" << n;
    if (collective_has_root(c)) h << " root=" << root;
    h << (in_place ? " in-place" : " out-of-place");
    head_ = h.str();
  }

  // compress= (verifier_codec.cc): 0 none; kCodecProjecting: messages pass through a codec Q
  // and, as host/compressed_lowering.cc does, a sender keeps Q(what it sent) and every sum is
  // projected where it is made; kCodecForgetful: the receiver decodes Q(v) but the sender keeps v
  // (the lowering the identity argument rules out). Q is modelled as a tag on a value's reduction
  // tree that depends on the whole coded piece (its elements' trees, sources and length: a block's
  // scale depends on its neighbours), idempotent only on the same piece, so ranks holding v and
  // Q(v), or values projected over different pieces, differ, as their bytes could.
  static constexpr int kCodecProjecting = 1, kCodecForgetful = 2;
  void set_codec(int mode) { codec_ = mode; }
  // compress_inter_only: messages between ranks of one host (equal host_of) travel raw (neither
  // end projects them, nor a sum made from one), and across two hosts or more all_gather's ranks
  // project their own block before anything travels (host/compressed_lowering.cc).
  void set_codec_inter_only(const std::vector<int>& host_of) { codec_hosts_ = host_of; }
  void run() {
    if (static_cast<int>(sch_.size()) != P_)
      fail("expected " + std::to_string(P_) + " schedules, got " + std::to_string(sch_.size()));
    all_ = sets_.all();
    ranks_.resize(P_);
    for (int r = 0; r < P_; ++r) setup_rank(r);
    int one_sided = -1, messages = -1;
    for (int r = 0; r < P_; ++r)
      for (const Step& st : sch_[r].steps)
        for (const Op& o : st.ops) (is_one_sided(o.kind) ? one_sided : is_message(o.kind) ? messages : r) = r;
    if (one_sided >= 0 && messages >= 0)
      fail("rank " + std::to_string(one_sided) + " uses one-sided ops and rank " + std::to_string(messages) +
           " sends or receives messages: a schedule uses one or the other");
    one_sided_ = one_sided >= 0;
    for (int r = 0; r < P_; ++r) validate_rank(r);
    if (trace_)
      for (int r = 0; r < P_; ++r) record(r);
    simulate();
    check_results();
  }
  // Record every rank's holdings after each step into `h` (verifier_trace.cc) during run().
  void trace_into(Holdings* h) { trace_ = h; }

 private:
  struct Rank {
    Layout L;
    Mem mem;
    size_t step = 0;
    SetId know = RankSets::kEmpty, know_at_entry = RankSets::kEmpty;
    std::vector<int> recv_from, send_to;  // the first op index with the peer in the current step, -1 if none
    std::vector<int> next_same;           // per op of the current step: the next op of its direction and peer, -1
    std::vector<int64_t> clock;  // one-sided: vector clock (verifier_hazards.h)
    std::vector<std::pair<int64_t, uint32_t>> waits;  // one-sided: (signal key, count) of step waits_of's waits
    size_t waits_of = SIZE_MAX;
  };
  friend class sched::SchedulePlayer<Replay>;

  [[noreturn]] void fail(const std::string& what) const { throw VerificationError(head_ + ": " + what); }

  std::string reg(const Region& g) const {
    return std::string(buffer_name(g.buf)) + "[" + std::to_string(g.offset) + ":" +
           std::to_string(g.offset + g.count) + "]";
  }
  std::string opdesc(const Op& o) const {
    std::string s = op_kind_name(o.kind);
    switch (o.kind) {
      case OpKind::Send: return s + "(to " + std::to_string(o.peer) + ", " + reg(o.src) + ")";
      case OpKind::Get:
      case OpKind::GetReduce:
        return s + "(from " + std::to_string(o.peer) + ", " + reg(o.dst) + " <- " + reg(o.src) + ")";
      case OpKind::Put: return s + "(to " + std::to_string(o.peer) + ", " + reg(o.dst) + " <- " + reg(o.src) + ")";
      case OpKind::ReduceToAll: return s + "(every rank's " + reg(o.dst) + " <- every rank's " + reg(o.src) + ")";
      case OpKind::ReduceFromAll: return s + "(" + reg(o.dst) + " <- every rank's " + reg(o.src) + ")";
      case OpKind::Signal:
      case OpKind::Wait: return s + "(" + std::to_string(o.peer) + ", tag " + std::to_string(o.tag) + ")";
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

  int64_t abs(int r, const Region& g) const {
    return region_start(ranks_[r].L.base, g);
  }
  bool noop_copy(int r, const Op& o) const {
    return o.kind == OpKind::Copy && o.dst.count == o.src.count && abs(r, o.dst) == abs(r, o.src);
  }


  // verifier_validate.cc: every op in bounds, peers valid, ops of a step independent.
  void setup_rank(int r);
  // The region of rank `owner`'s buffers (-1: r's own) op oi of r's step st names.
  void check_region(int r, size_t st, int oi, const Region& g, bool write, int owner = -1);
  void validate_rank(int r);
  void conflict(int r, size_t st, int a, int b, const char* kind);
  void check_independent(int r, size_t st);
  // verifier_play.cc: steps played by the schedule player (schedule/player.h) until every rank
  // finished or deadlock; the player's game is this class: the hooks below.
  void enter_step(int r);
  void finish_step(int r);
  void simulate();
  // verifier_one_sided.cc: one-sided schedules, played in an order their signals allow, with the
  // hazards of verifier_hazards.h checked on every access.
  void play_one_sided();
  bool step_ready(int r);
  void run_one_sided_step(int r);
  void reduce_to_all(int r, size_t st, int oi, const Op& o);  // one op of r's step st (verifier_one_sided.cc)
  void access(int r, size_t st, int oi, int owner, const Region& g, bool write);
  std::string arena_name(int owner, int64_t pos) const;
  std::string access_str(const Access& a) const;
  int64_t signal_key(int from, int to, int tag) const { return (static_cast<int64_t>(from) * P_ + to) * kSignalTags + tag; }
  const Op& op(int r, int i) const { return sch_[r].steps[ranks_[r].step].ops[i]; }
  int op_count(int r) const { return static_cast<int>(sch_[r].steps[ranks_[r].step].ops.size()); }
  sched::PlayKind op_kind(int r, int i) const {
    const OpKind k = op(r, i).kind;
    return k == OpKind::Send ? sched::PlayKind::Send
           : (k == OpKind::Recv || k == OpKind::RecvReduce) ? sched::PlayKind::Recv
                                                            : sched::PlayKind::Local;
  }
  int op_peer(int r, int i) const { return op(r, i).peer; }
  int find_op(int q, sched::PlayKind kind, int peer, const std::vector<uint8_t>& matched) const {
    // Messages of one pair in one step match in op order (ir.h): the first one not yet matched.
    const Rank& Q = ranks_[q];
    int qi = kind == sched::PlayKind::Send ? Q.send_to[peer] : Q.recv_from[peer];
    while (qi >= 0 && matched[qi]) qi = Q.next_same[qi];
    return qi;
  }
  void on_enter(int r);
  void on_transfer(int s, int si, int q, int qi);
  void on_complete(int r) { ready_.push_back(r); }
  int64_t step_of(int r) const { return static_cast<int64_t>(ranks_[r].step); }
  // verifier_results.cc: outputs against the collective's definition, one reduction order.
  void check_results();
  void project(std::vector<Run>& pieces);  // verifier_codec.cc: every valid value v -> Q(v)
  void project_inputs();                   // verifier_codec.cc: each rank's input block -> Q(block)
  void check_same_order();
  void expected(int r, std::vector<Run>& out);

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
  sched::SchedulePlayer<Replay> player_;
  std::vector<int> ready_;  // ranks whose step a peer completed, to finish
  std::vector<Iv> writes_, reads_;
  std::vector<Run> pa_, pb_, pc_;
  bool one_sided_ = false;
  Hazards hazards_;
  std::vector<std::vector<int64_t>> clocks_;  // the clocks signals carried (one per signalling step)
  std::unordered_map<int64_t, std::vector<uint32_t>> signals_;  // per (from, to, tag): index in clocks_ of each
  std::unordered_map<int64_t, size_t> consumed_;
  int codec_ = 0;
  std::unordered_map<uint64_t, uint64_t> codec_trees_;  // Q's output tree -> its piece's shape
  std::vector<int> codec_hosts_;  // compress_inter_only's host map; empty: every message coded
  bool coded(int s, int q) const {
    return codec_ && (codec_hosts_.empty() || codec_hosts_[static_cast<size_t>(s)] != codec_hosts_[static_cast<size_t>(q)]);
  }
  Holdings* trace_ = nullptr;
  void record(int r);  // appends rank r's buffers to trace_
};

}  // namespace verify
}  // namespace commlib
