// The event run's links, the posting of sends, waits and one-sided ops (run.h).
#include <algorithm>
#include <cmath>
#include <utility>
#include <vector>

#include "sim/run.h"

namespace commlib {
namespace sim {
namespace detail {

// (run.h: a step's sends posted at its entry, in the schedule's order.)
void Run::post_sends(int v) {
  RankState& R = ranks_[v];
  const int r = ph(v);
  const SimOp* b = shapes_.begin(R.shape);
  const int n = op_count(v);
  R.posts.assign(n, {now_, now_});
  order_.clear();
  for (int i = 0; i < n; ++i)
    if (b[i].kind == SimKind::Send) order_.push_back(i);
  std::stable_sort(order_.begin(), order_.end(), [b](int x, int y) { return b[x].post < b[y].post; });
  const double f = oversub_[t_.host_of[r]];
  for (int i : order_) {
    const int q = b[i].peer;
    const bool coded = codec_.coded(t_.host_of[r], t_.host_of[q]);
    const double cost = (t_.send_overhead_s + (coded ? codec_.sender_s(b[i].count) : 0)) * f;
    if (!coded && t_.intra_by_device && t_.host_of[r] == t_.host_of[q]) {
      R.posts[i] = {now_, now_ + cost};
      continue;
    }
    const double cpu0 = std::max(send_cpu_[r], now_);
    send_cpu_[r] = cpu0 + cost;
    cpu_[r] += cost;
    R.posts[i] = {cpu0, send_cpu_[r]};
  }
}

// Bytes from rank s's memory to rank q's over the links between them, from `start` (moved past a
// NIC's gap): when the last byte passed the most loaded link; the path's slowest bandwidth and
// latency.
double Run::wire(int s, int q, double bytes, double& start, double& slowest, double& latency) {
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
double Run::reduce_tail_s(int q, double bytes, double slowest) const {
  if (bytes <= 0) return 0.0;
  const double k = t_.chunk_bytes > 0 ? std::ceil(bytes / static_cast<double>(t_.chunk_bytes)) : 1.0;
  const double c = bytes / k, beta = 1.0 / slowest, gamma = rates_[q].reduce_s_per_byte;
  return c * gamma + (k - 1) * c * (std::max(beta, gamma) - beta);
}

// One-sided ops of r's step (ir.h): a get streams the peer's bytes over the link from it (and a
// get_reduce reduces them as they come), a put over the link to it, all from the step's entry.
void Run::one_sided_ops(int r) {  // (no lanes with one-sided ops: compact.cc)
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
void Run::post_signals(int r, double t) {
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
double Run::through_bucket(int res, double begin, double bytes) {
  const double level = std::min(t_.nic_burst_bytes, tokens_[res] + (begin - free_at_[res]) * t_.nic_Bps);
  const double seconds = std::max(0.0, bytes - level) / t_.nic_Bps;
  tokens_[res] = std::max(0.0, level - bytes);
  return seconds;
}

// When receiver q is running again to take a message from sender s whose first bytes arrive at
// `first` (topology.h: spin then sleep; on an oversubscribed host every receive waits its turn
// for a core, and sleeps first unless a yielding inter-host spin was still polling). The rest of
// the message streams in while it wakes.
double Run::receiver_running(int s, int vq, double first) const {
  const int q = ph(vq);
  const double f = oversub_[t_.host_of[q]];
  const bool inter = t_.host_of[s] != t_.host_of[q];
  const bool yielding = inter && t_.inter_spin_s >= 0;
  const double spin = yielding ? t_.inter_spin_s : t_.spin_s;
  const bool asleep = first - ranks_[vq].t > spin;
  if (f > 1.0) return first + (yielding && !asleep ? 0.0 : t_.wake_s) + (f - 1.0) * t_.sched_quantum_s;
  if (t_.wake_s > 0 && asleep) return first + t_.wake_s;
  return first;
}

}  // namespace detail
}  // namespace sim
}  // namespace commlib
