// The simulator's event run (simulator.h has the rules): one Run plays one call's compacted
// schedules on a topology. Its events, steps, matching and the timing of messages are here; its
// links, the posting of sends, waits and one-sided ops in run_links.cc; a laned call's list order
// (windows, intra-window gates) set up in run_order.cc; simulator.cc's simulate()
// builds (or finds built) the schedules and plays them. Internal to csrc/sim.
#pragma once

#include <algorithm>
#include <cstdint>
#include <queue>
#include <stdexcept>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "common/shapes.h"
#include "schedule/player.h"
#include "sim/codec_cost.h"
#include "sim/compact.h"
#include "sim/rates.h"
#include "sim/simulator.h"
#include "sim/topology.h"

namespace commlib {
namespace sim {
namespace detail {

class Run {
 public:
  // progs: per rank, or per rank and lane (`lanes` W > 1: compact.h): each (rank, lane) is a player
  // of its own, v = r * W + c, with its own steps, on rank r's links, CPU and rates.
  // `order` (with a window > 0: ir.h Schedule::window, or intra-window gates): per rank, each list
  // step's lane; then a rank's step i enters only once its lane's previous step, step i - window
  // and the step `gates`[r][i] (if any: Schedule::intra_window, compact.h) have finished.
  Run(const Topology& t, const std::vector<RankRates>& rates, const ShapeTable& shapes,
      const std::vector<Program>& progs, int elem_bytes, Trace* trace, const CodecCost& codec, int lanes = 1,
      const std::vector<std::vector<uint16_t>>* order = nullptr, int window = 0,
      const std::vector<std::vector<int>>* gates = nullptr)
      : t_(t), rates_(rates), shapes_(shapes), progs_(progs), eb_(elem_bytes), P_(t.size()), H_(t.hosts()),
        W_(lanes), V_(t.size() * lanes), player_(*this), trace_(trace), codec_(codec),
        order_lanes_(order), window_(window), shared_core_(lanes > 1 && !t.intra_by_device) {
    if (static_cast<int>(progs.size()) != V_) throw std::logic_error("simulate: programs for ranks x lanes expected");
    if (order_lanes_) set_list_order(gates);
    ranks_.resize(V_);
    player_.reset(V_);
    free_at_.assign(2 * P_ + H_ + 2 * H_ * t.nics_per_host, 0.0);
    busy_.assign(free_at_.size(), 0.0);
    cpu_.assign(P_, 0.0);
    nic_next_.assign(2 * H_ * t.nics_per_host, 0.0);
    tokens_.assign(free_at_.size(), 0.0);
    send_cpu_.assign(P_, 0.0);
    recv_cpu_.assign(P_, 0.0);
    core_free_.assign(P_, 0.0);
    oversub_ = oversubscription(t);
  }

  void play(Result& res, double stop_after_s) {
    for (int v = 0; v < V_; ++v) {  // the codec's prelude (error feedback) first, on the rank's share of a core
      const int r = ph(v);
      schedule_entry(v, cpu_[r] = send_cpu_[r] = recv_cpu_[r] = codec_.prelude_s * oversub_[t_.host_of[r]]);
    }
    while (!heap_.empty()) {
      const Event e = heap_.top();
      if (e.time > stop_after_s) {  // every later event, and so the finish, is later still
        res.cut = true;
        res.time_s = e.time;
        res.steps = steps_;
        return;
      }
      heap_.pop();
      if (e.gen == ranks_[e.rank].gen) enter(e.rank, e.time);  // else superseded by a later entry
    }
    if (order_lanes_)
      for (int r = 0; r < P_; ++r)
        if (next_[r] < (*order_lanes_)[r].size())
          throw std::runtime_error("simulate: deadlock: rank " + std::to_string(r) + " entered " + std::to_string(next_[r]) +
                                   " of its " + std::to_string((*order_lanes_)[r].size()) +
                                   " steps (a lane or the window never freed the next: verify the schedule)");
    for (int r = 0; r < V_; ++r)
      if (ranks_[r].blocked)
        throw std::runtime_error("simulate: deadlock: rank " + std::to_string(r) + " stuck in step " +
                                 std::to_string(ranks_[r].step) + " waiting for a signal never sent (verify the schedule)");
    const std::string stuck = player_.deadlock();
    if (!stuck.empty()) throw std::runtime_error("simulate: " + stuck + " (verify the schedule)");
    for (int v = 0; v < V_; ++v) res.time_s = std::max(res.time_s, ranks_[v].t);
    res.steps = steps_;
    res.transfers = transfers_;
    res.bytes_inter = bytes_inter_;
    res.bytes_intra = bytes_intra_;
    for (int k = 0; k < 2 * P_; ++k) res.port_busy_s = std::max(res.port_busy_s, busy_[k]);
    for (size_t k = 2 * P_ + H_; k < busy_.size(); ++k) res.nic_busy_s = std::max(res.nic_busy_s, busy_[k]);
    for (double c : cpu_) res.cpu_busy_s = std::max(res.cpu_busy_s, c);
  }

 private:
  struct RankState {
    size_t run = 0;      // index into the program
    uint32_t left = 0;   // steps left in that run, including the current one
    int64_t step = 0;
    double t = 0;        // entry time of the current step, or finish time when done
    double end = 0;      // latest end of the current step's communication
    uint32_t shape = 0;
    uint64_t gen = 0;    // entry events of an earlier generation are stale
    bool blocked = false;  // its step waits for a signal not sent yet
    std::vector<std::pair<double, double>> posts;  // per op of the step: a send's CPU post (begin, end)
  };
  friend class sched::SchedulePlayer<Run>;
  struct Event {
    double time;
    int rank;
    uint64_t gen;
    bool operator<(const Event& o) const { return time > o.time || (time == o.time && rank > o.rank); }
  };

  // Positions the rank on its next step (not yet entered) and queues its entry.
  void schedule_entry(int r, double t) {
    RankState& R = ranks_[r];
    const Program& p = progs_[r];
    if (R.left == 0) {
      if (R.step > 0) ++R.run;
      while (R.run < p.size() && p[R.run].second == 0) ++R.run;
      if (R.run >= p.size()) {
        player_.finish(r);
        R.t = t;
        return;
      }
      R.left = p[R.run].second;
    }
    R.shape = p[R.run].first;
    const double at = R.step > 0 ? on_core(ph(r), t, t_.step_overhead_s * oversub_[t_.host_of[ph(r)]]) : t;
    if (!order_lanes_) return heap_.push(Event{at, r, ++R.gen});
    ready_[r] = at;  // the window decides when it enters
    start_if_free(r);
  }

  // Player v's next step enters once it is ready and the step `window_` before it finished.
  // The list order's bookkeeping (run_order.cc): each list step's next in its lane, each lane's
  // first, and the intra window's wakes (the step each gate's finish frees).
  void set_list_order(const std::vector<std::vector<int>>* gates);
  void start_if_free(int v) {
    const int r = ph(v);
    const size_t i = pos_[v];
    if (ready_[v] < 0 || i == SIZE_MAX) return;
    double at = ready_[v];
    if (window_ > 0 && i >= static_cast<size_t>(window_)) {
      const double d = done_[r][i - window_];
      if (d < 0) return;  // its finish starts it
      at = std::max(at, d);
    }
    if (gates_ && !(*gates_)[r].empty() && (*gates_)[r][i] >= 0) {  // the intra window's
      const double d = done_[r][(*gates_)[r][i]];
      if (d < 0) return;
      at = std::max(at, d);
    }
    ready_[v] = -1;
    cur_[v] = i;
    pos_[v] = nxt_[r][i];
    ++next_[r];
    heap_.push(Event{at, v, ++ranks_[v].gen});
  }

  // The schedule player's game (schedule/player.h): the ops of a rank's current step shape.
  int op_count(int r) const { return static_cast<int>(shapes_.end(ranks_[r].shape) - shapes_.begin(ranks_[r].shape)); }
  sched::PlayKind op_kind(int r, int i) const {
    const SimKind k = shapes_.begin(ranks_[r].shape)[i].kind;
    return k == SimKind::Send ? sched::PlayKind::Send
           : (k == SimKind::Recv || k == SimKind::RecvReduce) ? sched::PlayKind::Recv
                                                              : sched::PlayKind::Local;
  }
  int op_peer(int r, int i) const { return shapes_.begin(ranks_[r].shape)[i].peer * W_ + r % W_; }  // its lane's player
  int ph(int v) const { return v / W_; }  // the rank a player (rank, lane) runs on
  int64_t step_of(int r) const { return ranks_[r].step; }

  // The op index in rank q's current step of `kind` with `peer`, the first unmatched in op order; -1
  // (a shape's ops are sorted by sort_class, peer, then SimOp::nth: op order among a pair's messages
  // in one direction, the order they match in and the order the player tries them in).
  int find_op(int q, sched::PlayKind kind, int peer, const std::vector<uint8_t>& matched) const {
    const RankState& Q = ranks_[q];
    const SimOp* b = shapes_.begin(Q.shape);
    const SimOp* e = shapes_.end(Q.shape);
    const int cls = sort_class(kind == sched::PlayKind::Send ? SimKind::Send : SimKind::Recv);
    auto before = [](const SimOp& x, const std::pair<int, int>& k) {
      return sort_class(x.kind) != k.first ? sort_class(x.kind) < k.first : x.peer < k.second;
    };
    peer = ph(peer);  // shapes name ranks
    for (const SimOp* it = std::lower_bound(b, e, std::make_pair(cls, peer), before);
         it != e && sort_class(it->kind) == cls && it->peer == peer; ++it)
      if (!matched[it - b]) return static_cast<int>(it - b);
    return -1;
  }

  // Rank r enters its step at `t`, once the signals its waits consume have arrived (a later entry
  // is queued for when they arrive); the player matches its messages (on_transfer times each).
  void enter(int r, double t) {
    RankState& R = ranks_[r];
    const SimOp *b = shapes_.begin(R.shape), *e = shapes_.end(R.shape);
    double at = t;
    size_t again = 0;  // earlier waits of this step on the same flag (a shape's equal ops are adjacent)
    for (const SimOp* o = b; o != e; ++o) {
      if (o->kind != SimKind::Wait) continue;
      again = o != b && o[-1].kind == SimKind::Wait && o[-1].peer == o->peer && o[-1].count == o->count ? again + 1 : 0;
      const int64_t key = signal_key(o->peer, r, o->count);
      const size_t k = consumed_[key] + again;
      const std::vector<double>& arrived = posted_[key];
      R.blocked = k >= arrived.size();
      if (R.blocked) return;  // the signal's post queues the entry again
      at = std::max(at, arrived[k]);
    }
    if (at > t) return heap_.push(Event{at, r, R.gen});
    for (const SimOp* o = b; o != e; ++o)
      if (o->kind == SimKind::Wait) ++consumed_[signal_key(o->peer, r, o->count)];
    now_ = t;
    if (player_.enter(r)) finish_step(r);
  }
  int64_t signal_key(int from, int to, int64_t tag) const { return (static_cast<int64_t>(from) * P_ + to) * kSignalTags + tag; }
  void on_enter(int r) {
    RankState& R = ranks_[r];
    R.t = now_;
    R.end = now_;
    ++steps_;
    post_sends(r);
  }

  // Rank r's CPU posts its step's sends at its entry, in the schedule's order (SimOp::post: the
  // executor's), send_overhead_s each (and a coded message's encoding), one after another, whether
  // or not their receivers are there yet; a message inside a host moved by the devices
  // (intra_by_device) is not the CPU's: its overhead is its own, from the entry.
  void post_sends(int r);
  void on_complete(int r) { finish_step(r); }
  void on_transfer(int s, int si, int q, int qi) { transfer(s, si, q, qi, now_); }

  // Sender s (op si) to receiver q (op qi); both are in their steps, the later entered at `t`.
  void transfer(int vs, int si, int vq, int qi, double t) {
    RankState& S = ranks_[vs];
    RankState& Q = ranks_[vq];
    const int s = ph(vs), q = ph(vq);
    const SimOp& so = shapes_.begin(S.shape)[si];
    const SimOp& ro = shapes_.begin(Q.shape)[qi];
    if (so.count != ro.count)
      throw std::runtime_error("simulate: rank " + std::to_string(s) + " sends " + std::to_string(so.count) +
                               " elements but rank " + std::to_string(q) + " receives " + std::to_string(ro.count));
    const bool coded = codec_.coded(t_.host_of[s], t_.host_of[q]);
    const double bytes = codec_.bytes(so.count, eb_, coded);
    // Both ranks post their op; on an oversubscribed host that CPU work waits its share of a core.
    // The sender's CPU posted it at its entry (post_sends: LogGP's o, send side, encoding first);
    // the bytes move once both ranks are there.
    const double fs = oversub_[t_.host_of[s]], fq = oversub_[t_.host_of[q]];
    const std::pair<double, double> post = S.posts[si];
    const int64_t piece = codec_.streamed_piece(coded, so.count);  // codec_cost.h: the overlap
    double start = std::max(t + t_.op_overhead_s * std::max(fs, fq),
                            piece ? post.first + (t_.send_overhead_s + codec_.sender_s(piece)) * fs : post.second);
    double slowest, latency;
    double wire_done = wire(s, q, bytes, start, slowest, latency);
    if (piece) wire_done = std::max(wire_done, post.second + codec_.bytes(piece, eb_, true) / slowest);
    // A reducing receive adds the reduction its chunk pipeline cannot hide behind the transfer.
    const bool reduces = ro.kind == SimKind::RecvReduce;
    const double reduce_tail = coded ? codec_.receiver_s(piece ? piece : ro.count, reduces, rates_[q].reduce_s_per_byte, eb_) * fq
                               : reduces ? reduce_tail_s(q, bytes, slowest) : 0.0;
    S.end = std::max(S.end, wire_done + latency);
    // A receiver asleep when the bytes are in reduces them once it is running again; its CPU takes
    // the messages in one after another (LogGP's o, receive side).
    double taken = std::max(wire_done + latency, receiver_running(s, vq, start + latency));
    if (t_.recv_overhead_s > 0 && !coded && t_.intra_by_device && t_.host_of[s] == t_.host_of[q]) {
      taken += t_.recv_overhead_s * fq;  // the device takes it in, not the CPU (post_sends)
    } else if (t_.recv_overhead_s > 0) {
      recv_cpu_[q] = std::max(recv_cpu_[q], taken) + t_.recv_overhead_s * fq;
      cpu_[q] += t_.recv_overhead_s * fq;
      taken = recv_cpu_[q];
    }
    Q.end = std::max(Q.end, on_core(q, taken, reduce_tail));
    if (piece) {  // all the receiver's work, from the first piece's arrival and after its own encoding
      const double work = codec_.receiver_s(ro.count, reduces, rates_[q].reduce_s_per_byte, eb_) * fq;
      const double first_in = start + latency + codec_.bytes(piece, eb_, true) / slowest;
      Q.end = std::max({Q.end, first_in + work, send_cpu_[q] + work});
    }
    ++transfers_;
    if (trace_) trace_->transfers.push_back({s, q, S.step, Q.step, bytes, start, wire_done + latency, wire_links_});
  }

  // Bytes from rank s's memory to rank q's over the links between them, from `start` (moved past a
  // NIC's gap): when the last byte passed the most loaded link; the path's slowest bandwidth and
  // latency.
  double wire(int s, int q, double bytes, double& start, double& slowest, double& latency);

  // Reducing `bytes` as they arrive, in chunks: k chunks of c bytes take c(beta + gamma) +
  // (k-1) c max(beta, gamma) instead of k c beta; this is what the transfer cannot hide.
  double reduce_tail_s(int q, double bytes, double slowest) const;

  // One-sided ops of r's step (ir.h): a get streams the peer's bytes over the link from it (and a
  // get_reduce reduces them as they come), a put over the link to it, all from the step's entry.
  void one_sided_ops(int r);

  // r's signals, raised at `t` (its step's data done): each arrives one latency later, and a peer
  // waiting for it tries to enter again then.
  void post_signals(int r, double t);

  // Seconds a NIC direction with a token bucket (Topology::nic_burst_bytes) takes to pass `bytes`
  // from `begin` (it was idle or done before): the tokens gathered since its last message, up to the
  // bucket, pass at once, the rest at the bucket's rate.
  double through_bucket(int res, double begin, double bytes);

  // When receiver q (a player: its entry time) is running again to take a message from sender
  // (rank) s whose first bytes arrive at `first` (topology.h: spin then sleep; on an oversubscribed host every receive waits its turn
  // for a core, and sleeps first unless a yielding inter-host spin was still polling). The rest of
  // the message streams in while it wakes.
  double receiver_running(int s, int q, double first) const;

  // `work` seconds of rank r's CPU from `from`: when it is done. A laned call on a CPU host
  // (shared_core_: the host executor's one progress thread per rank runs every lane's steps,
  // docs/DESIGN.md "Laned calls") does each lane's step entry, reductions of received bytes and
  // local copies and reductions one after another on that thread, first come, first served as the
  // links are (the order the run reaches them); one lane, or devices moving a host's data, each
  // player's own (a lane's steps follow one another anyway).
  double on_core(int r, double from, double work) {
    if (!shared_core_ || work <= 0) return from + work;
    const double begin = std::max(from, core_free_[r]);
    core_free_[r] = begin + work;
    return core_free_[r];
  }

  void finish_step(int v) {
    RankState& R = ranks_[v];
    const int r = ph(v);
    one_sided_ops(v);
    double work = 0;
    for (const SimOp* o = shapes_.begin(R.shape); o != shapes_.end(R.shape); ++o) {
      const double bytes = static_cast<double>(o->count) * eb_;
      if (o->kind == SimKind::Copy) work += bytes * rates_[r].copy_s_per_byte;
      else if (o->kind == SimKind::Reduce) work += bytes * rates_[r].reduce_s_per_byte;
    }
    const double t = on_core(r, R.end, work);
    if (trace_) trace_->steps[r].emplace_back(R.t, t);
    post_signals(v, t);
    --R.left;
    ++R.step;
    player_.leave(v);
    const size_t done = order_lanes_ ? cur_[v] : 0;  // (schedule_entry may move cur_[v] on)
    if (order_lanes_) done_[r][done] = t;
    schedule_entry(v, t);
    if (order_lanes_ && window_ > 0 && done + window_ < done_[r].size())  // the step the window held for this one
      start_if_free(r * W_ + (*order_lanes_)[r][done + window_]);
    if (gates_ && !wakes_[r].empty() && wakes_[r][done] >= 0)  // the step the intra window held
      start_if_free(r * W_ + (*order_lanes_)[r][wakes_[r][done]]);
  }

  const Topology& t_;
  const std::vector<RankRates>& rates_;
  const ShapeTable& shapes_;
  const std::vector<Program>& progs_;
  const int eb_, P_, H_;
  const int W_, V_;  // lanes per rank (schedule/lanes.h) and players (ranks x lanes)
  std::vector<RankState> ranks_;
  std::vector<double> free_at_;  // per link: when it is free again
  std::vector<double> busy_;     // per link: seconds it served bytes (Result's accounting)
  std::vector<double> cpu_;      // per rank: seconds of per-message CPU costs
  std::vector<double> nic_next_;  // per NIC direction: when it may start its next message
  std::vector<double> tokens_;    // per link: a NIC bucket's tokens when it was last free (free_at_)
  std::vector<double> send_cpu_, recv_cpu_;  // per rank: when its CPU has posted / taken in its last message
  std::vector<double> oversub_;  // per host: ranks per core when above 1, else 1
  std::priority_queue<Event> heap_;
  sched::SchedulePlayer<Run> player_;
  double now_ = 0;  // the entering rank's entry time
  std::unordered_map<int64_t, std::vector<double>> posted_;  // per (from, to, tag): arrival of each signal
  std::unordered_map<int64_t, size_t> consumed_;             // per (from, to, tag): signals waited for
  Trace* trace_ = nullptr;
  const CodecCost codec_;
  std::vector<int> wire_links_;  // the links the last wire() crossed (traced runs only)
  std::vector<int> order_;       // post_sends' scratch: a step's sends in post order
  // The window (ir.h Schedule::window; null: none): per rank each list step's lane, the steps entered
  // so far, when each finished (-1: not yet) and each step's next in its lane; per player when its
  // next step may enter as far as its lane goes (-1: not ready), its current step's list index and
  // its next one's (SIZE_MAX: none left).
  const std::vector<std::vector<uint16_t>>* order_lanes_ = nullptr;
  int window_ = 0;
  const std::vector<std::vector<int>>* gates_ = nullptr;  // the intra window's (null or empty per rank: none)
  std::vector<std::vector<int>> wakes_;                   // per rank and list step: the step its finish frees (-1)
  const bool shared_core_;         // lanes on a CPU host: the rank's one progress thread (on_core)
  std::vector<double> core_free_;  // per rank: when that thread has done the work it took on
  std::vector<size_t> next_;
  std::vector<std::vector<double>> done_;
  std::vector<double> ready_;
  std::vector<size_t> cur_;
  std::vector<size_t> pos_;
  std::vector<std::vector<size_t>> nxt_;
  int64_t steps_ = 0, transfers_ = 0, bytes_inter_ = 0, bytes_intra_ = 0;
};

}  // namespace detail
}  // namespace sim
}  // namespace commlib
