// The event run (simulator.h).
#include "sim/simulator.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <queue>
#include <stdexcept>
#include <unordered_map>
#include <vector>

#include "common/shapes.h"
#include "schedule/player.h"
#include "schedule/registry.h"
#include "sim/compact.h"
#include "sim/rates.h"

namespace commlib {
namespace sim {

namespace {

double now_s() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

class Run {
 public:
  Run(const Topology& t, const std::vector<RankRates>& rates, const ShapeTable& shapes,
      const std::vector<Program>& progs, int elem_bytes, Trace* trace, const CodecCost& codec)
      : t_(t), rates_(rates), shapes_(shapes), progs_(progs), eb_(elem_bytes), P_(t.size()), H_(t.hosts()),
        player_(*this), trace_(trace), codec_(codec) {
    ranks_.resize(P_);
    player_.reset(P_);
    free_at_.assign(2 * P_ + H_ + 2 * H_ * t.nics_per_host, 0.0);
    busy_.assign(free_at_.size(), 0.0);
    cpu_ = send_cpu_ = recv_cpu_ = std::vector<double>(P_, 0.0);  // play() starts them at the prelude
    nic_next_.assign(2 * H_ * t.nics_per_host, 0.0);
    tokens_.assign(free_at_.size(), 0.0);
    oversub_ = oversubscription(t);
  }

  void play(Result& res, double stop_after_s) {
    for (int r = 0; r < P_; ++r)  // the codec's prelude (error feedback) first, on the rank's share of a core
      schedule_entry(r, cpu_[r] = send_cpu_[r] = recv_cpu_[r] = codec_.prelude_s * oversub_[t_.host_of[r]]);
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
    for (int r = 0; r < P_; ++r)
      if (ranks_[r].blocked)
        throw std::runtime_error("simulate: deadlock: rank " + std::to_string(r) + " stuck in step " +
                                 std::to_string(ranks_[r].step) + " waiting for a signal never sent (verify the schedule)");
    const std::string stuck = player_.deadlock();
    if (!stuck.empty()) throw std::runtime_error("simulate: " + stuck + " (verify the schedule)");
    for (int r = 0; r < P_; ++r) res.time_s = std::max(res.time_s, ranks_[r].t);
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
    heap_.push(Event{t + (R.step > 0 ? t_.step_overhead_s * oversub_[t_.host_of[r]] : 0.0), r, ++R.gen});
  }

  // The schedule player's game (schedule/player.h): the ops of a rank's current step shape.
  int op_count(int r) const { return static_cast<int>(shapes_.end(ranks_[r].shape) - shapes_.begin(ranks_[r].shape)); }
  sched::PlayKind op_kind(int r, int i) const {
    const SimKind k = shapes_.begin(ranks_[r].shape)[i].kind;
    return k == SimKind::Send ? sched::PlayKind::Send
           : (k == SimKind::Recv || k == SimKind::RecvReduce) ? sched::PlayKind::Recv
                                                              : sched::PlayKind::Local;
  }
  int op_peer(int r, int i) const { return shapes_.begin(ranks_[r].shape)[i].peer; }
  int64_t step_of(int r) const { return ranks_[r].step; }

  // The op index in rank q's current step of `kind` with `peer`, unmatched; -1 (a shape's ops are
  // sorted by kind, then peer).
  int find_op(int q, sched::PlayKind kind, int peer, const std::vector<uint8_t>& matched) const {
    const RankState& Q = ranks_[q];
    const SimOp* b = shapes_.begin(Q.shape);
    const SimOp* e = shapes_.end(Q.shape);
    auto by_kind_peer = [](const SimOp& x, const SimOp& k) { return x.kind != k.kind ? x.kind < k.kind : x.peer < k.peer; };
    if (kind == sched::PlayKind::Send) {
      const SimOp* it = std::lower_bound(b, e, SimOp{peer, SimKind::Send, 0}, by_kind_peer);
      if (it != e && it->kind == SimKind::Send && it->peer == peer && !matched[it - b]) return static_cast<int>(it - b);
      return -1;
    }
    for (SimKind k : {SimKind::Recv, SimKind::RecvReduce}) {
      const SimOp* it = std::lower_bound(b, e, SimOp{peer, k, 0}, by_kind_peer);
      if (it != e && it->kind == k && it->peer == peer && !matched[it - b]) return static_cast<int>(it - b);
    }
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
  }
  void on_complete(int r) { finish_step(r); }
  void on_transfer(int s, int si, int q, int qi) { transfer(s, si, q, qi, now_); }

  // Sender s (op si) to receiver q (op qi); both are in their steps, the later entered at `t`.
  void transfer(int s, int si, int q, int qi, double t) {
    RankState& S = ranks_[s];
    RankState& Q = ranks_[q];
    const SimOp& so = shapes_.begin(S.shape)[si];
    const SimOp& ro = shapes_.begin(Q.shape)[qi];
    if (so.count != ro.count)
      throw std::runtime_error("simulate: rank " + std::to_string(s) + " sends " + std::to_string(so.count) +
                               " elements but rank " + std::to_string(q) + " receives " + std::to_string(ro.count));
    const bool coded = codec_.coded(t_.host_of[s], t_.host_of[q]);
    const double bytes = codec_.bytes(so.count, eb_, coded);
    // Both ranks post their op; on an oversubscribed host that CPU work waits its share of a core.
    // The sender's CPU posts its sends one after another (LogGP's o, send side), encoding first.
    const double fs = oversub_[t_.host_of[s]], fq = oversub_[t_.host_of[q]];
    double start = t + t_.op_overhead_s * std::max(fs, fq);
    const int64_t piece = codec_.streamed_piece(coded, so.count);  // codec_cost.h: the overlap
    if (t_.send_overhead_s > 0 || coded) {
      const double cpu0 = std::max(send_cpu_[s], t);
      send_cpu_[s] = cpu0 + (t_.send_overhead_s + (coded ? codec_.sender_s(so.count) : 0)) * fs;
      cpu_[s] += send_cpu_[s] - cpu0;
      start = std::max(start, piece ? cpu0 + (t_.send_overhead_s + codec_.sender_s(piece)) * fs : send_cpu_[s]);
    }
    double slowest, latency;
    double wire_done = wire(s, q, bytes, start, slowest, latency);
    if (piece) wire_done = std::max(wire_done, send_cpu_[s] + codec_.bytes(piece, eb_, true) / slowest);
    // A reducing receive adds the reduction its chunk pipeline cannot hide behind the transfer.
    const bool reduces = ro.kind == SimKind::RecvReduce;
    const double reduce_tail = coded ? codec_.receiver_s(piece ? piece : ro.count, reduces, rates_[q].reduce_s_per_byte, eb_) * fq
                               : reduces ? reduce_tail_s(q, bytes, slowest) : 0.0;
    S.end = std::max(S.end, wire_done + latency);
    // A receiver asleep when the bytes are in reduces them once it is running again; its CPU takes
    // the messages in one after another (LogGP's o, receive side).
    double taken = std::max(wire_done + latency, receiver_running(s, q, start + latency));
    if (t_.recv_overhead_s > 0) {
      recv_cpu_[q] = std::max(recv_cpu_[q], taken) + t_.recv_overhead_s * fq;
      cpu_[q] += t_.recv_overhead_s * fq;
      taken = recv_cpu_[q];
    }
    Q.end = std::max(Q.end, taken + reduce_tail);
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
  double wire(int s, int q, double bytes, double& start, double& slowest, double& latency) {
    // Links on the path and their bandwidths.
    int res[3];
    double bw[3];
    int nres = 0;
    const int hs = t_.host_of[s], hq = t_.host_of[q];
    if (hs == hq) {
      latency = t_.intra_latency_s;
      res[nres] = s, bw[nres++] = rates_[s].port_Bps;
      res[nres] = P_ + q, bw[nres++] = rates_[q].port_Bps;
      if (t_.intra_bus_Bps > 0) res[nres] = 2 * P_ + hs, bw[nres++] = t_.intra_bus_Bps;
      bytes_intra_ += static_cast<int64_t>(bytes);
    } else {
      latency = t_.inter_latency_s;
      const int nics = t_.nics_per_host, base = 2 * P_ + H_;
      if (t_.nic_gap_s > 0) {  // each NIC starts one message per gap, per direction (LogGP's g)
        const int out = hs * nics + t_.nic_of[s], in = H_ * nics + hq * nics + t_.nic_of[q];
        start = std::max({start, nic_next_[out], nic_next_[in]});
        nic_next_[out] = nic_next_[in] = start + t_.nic_gap_s;
      }
      res[nres] = base + hs * nics + t_.nic_of[s], bw[nres++] = t_.nic_Bps;
      res[nres] = base + H_ * nics + hq * nics + t_.nic_of[q], bw[nres++] = t_.nic_Bps;
      bytes_inter_ += static_cast<int64_t>(bytes);
    }
    // Each link is a first-come-first-served server: the transfer's bytes pass every link on the
    // path (cut-through), so it is done when its most loaded link has served it.
    slowest = bw[0];
    double wire_done = start;
    for (int i = 0; i < nres; ++i) {
      slowest = std::min(slowest, bw[i]);
      const double begin = std::max(start, free_at_[res[i]]);
      const bool bucket = hs != hq && t_.nic_burst_bytes > 0;
      const double served = bucket ? through_bucket(res[i], begin, bytes) : bytes / bw[i];
      free_at_[res[i]] = begin + served;
      busy_[res[i]] += served;
      wire_done = std::max(wire_done, free_at_[res[i]]);
    }
    if (trace_) wire_links_.assign(res, res + nres);
    return wire_done;
  }

  // Reducing `bytes` as they arrive, in chunks: k chunks of c bytes take c(beta + gamma) +
  // (k-1) c max(beta, gamma) instead of k c beta; this is what the transfer cannot hide.
  double reduce_tail_s(int q, double bytes, double slowest) const {
    if (bytes <= 0) return 0.0;
    const double k = t_.chunk_bytes > 0 ? std::ceil(bytes / static_cast<double>(t_.chunk_bytes)) : 1.0;
    const double c = bytes / k, beta = 1.0 / slowest, gamma = rates_[q].reduce_s_per_byte;
    return c * gamma + (k - 1) * c * (std::max(beta, gamma) - beta);
  }

  // One-sided ops of r's step (ir.h): a get streams the peer's bytes over the link from it (and a
  // get_reduce reduces them as they come), a put over the link to it, all from the step's entry.
  void one_sided_ops(int r) {
    RankState& R = ranks_[r];
    for (const SimOp* o = shapes_.begin(R.shape); o != shapes_.end(R.shape); ++o) {
      if (o->kind != SimKind::Get && o->kind != SimKind::GetReduce && o->kind != SimKind::Put) continue;
      const bool get = o->kind != SimKind::Put;
      const double bytes = static_cast<double>(o->count) * eb_;
      double start = R.t + t_.op_overhead_s * oversub_[t_.host_of[r]], slowest, latency;
      const double done = get ? wire(o->peer, r, bytes, start, slowest, latency) : wire(r, o->peer, bytes, start, slowest, latency);
      const double tail = o->kind == SimKind::GetReduce ? reduce_tail_s(r, bytes, slowest) : 0.0;
      R.end = std::max(R.end, done + latency + tail);
      ++transfers_;
      if (trace_)  // one-sided: the bytes move in r's step, whichever way they go
        trace_->transfers.push_back({get ? o->peer : r, get ? r : o->peer, R.step, R.step, bytes, start, done + latency, wire_links_});
    }
  }

  // r's signals, raised at `t` (its step's data done): each arrives one latency later, and a peer
  // waiting for it tries to enter again then.
  void post_signals(int r, double t) {
    for (const SimOp* o = shapes_.begin(ranks_[r].shape); o != shapes_.end(ranks_[r].shape); ++o) {
      if (o->kind != SimKind::Signal) continue;
      const int q = o->peer;
      const double latency = t_.host_of[r] == t_.host_of[q] ? t_.intra_latency_s : t_.inter_latency_s;
      const double at = t + t_.op_overhead_s * oversub_[t_.host_of[r]] + latency;
      posted_[signal_key(r, q, o->count)].push_back(at);
      if (ranks_[q].blocked) {
        ranks_[q].blocked = false;
        heap_.push(Event{at, q, ranks_[q].gen});
      }
    }
  }

  // Seconds a NIC direction with a token bucket (Topology::nic_burst_bytes) takes to pass `bytes`
  // from `begin` (it was idle or done before): the tokens gathered since its last message, up to the
  // bucket, pass at once, the rest at the bucket's rate.
  double through_bucket(int res, double begin, double bytes) {
    const double level = std::min(t_.nic_burst_bytes, tokens_[res] + (begin - free_at_[res]) * t_.nic_Bps);
    const double seconds = std::max(0.0, bytes - level) / t_.nic_Bps;
    tokens_[res] = std::max(0.0, level - bytes);
    return seconds;
  }

  // When receiver q is running again to take a message from sender s whose first bytes arrive at
  // `first` (topology.h: spin then sleep; on an oversubscribed host every receive waits its turn
  // for a core, and sleeps first unless a yielding inter-host spin was still polling). The rest of
  // the message streams in while it wakes.
  double receiver_running(int s, int q, double first) const {
    const double f = oversub_[t_.host_of[q]];
    const bool inter = t_.host_of[s] != t_.host_of[q];
    const bool yielding = inter && t_.inter_spin_s >= 0;
    const double spin = yielding ? t_.inter_spin_s : t_.spin_s;
    const bool asleep = first - ranks_[q].t > spin;
    if (f > 1.0) return first + (yielding && !asleep ? 0.0 : t_.wake_s) + (f - 1.0) * t_.sched_quantum_s;
    if (t_.wake_s > 0 && asleep) return first + t_.wake_s;
    return first;
  }

  void finish_step(int r) {
    RankState& R = ranks_[r];
    one_sided_ops(r);
    double t = R.end;
    for (const SimOp* o = shapes_.begin(R.shape); o != shapes_.end(R.shape); ++o) {
      const double bytes = static_cast<double>(o->count) * eb_;
      if (o->kind == SimKind::Copy) t += bytes * rates_[r].copy_s_per_byte;
      else if (o->kind == SimKind::Reduce) t += bytes * rates_[r].reduce_s_per_byte;
    }
    if (trace_) trace_->steps[r].emplace_back(R.t, t);
    post_signals(r, t);
    --R.left;
    ++R.step;
    player_.leave(r);
    schedule_entry(r, t);
  }

  const Topology& t_;
  const std::vector<RankRates>& rates_;
  const ShapeTable& shapes_;
  const std::vector<Program>& progs_;
  const int eb_, P_, H_;
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
  int64_t steps_ = 0, transfers_ = 0, bytes_inter_ = 0, bytes_intra_ = 0;
};

}  // namespace

Result simulate(Collective c, const Composition& how, int64_t count, int elem_bytes, int root,
                const Topology& topo, const Options& opts) {
  check_call(c, count, elem_bytes, root, topo);
  if (how.segment < 0) throw std::invalid_argument("segment: must be >= 0, got " + std::to_string(how.segment));
  const int P = topo.size();
  if (!collective_has_root(c)) root = 0;
  Result res;
  const double t0 = now_s();
  ShapeTable shapes;
  std::vector<int64_t> scratch;
  const std::vector<Program> progs = build_programs(c, how, P, count, root, topo.host_of, shapes, &scratch);
  const double t1 = now_s();
  const std::vector<RankRates> rates = rank_rates(topo, c, count, elem_bytes, root, scratch, res);
  if (opts.trace) start_trace(*opts.trace, topo);
  Run run(topo, rates, shapes, progs, elem_bytes, opts.trace, opts.codec);
  run.play(res, opts.stop_after_s);
  res.build_s = t1 - t0;
  res.run_s = now_s() - t1;
  res.shapes = static_cast<int64_t>(shapes.size());
  return res;
}

}  // namespace sim
}  // namespace commlib
