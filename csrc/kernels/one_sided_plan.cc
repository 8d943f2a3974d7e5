// One-sided device plans (one_sided_plan.h). The check is written apart from the lowering: it
// attributes each item to the operation whose regions contain it and checks that each operation's
// items tile its regions, rather than lowering again and comparing.
#include "kernels/one_sided_plan.h"

#include <algorithm>
#include <map>
#include <stdexcept>
#include <tuple>

namespace commlib {

using namespace kplan;

static_assert(kplan::kSignalTags == static_cast<uint32_t>(commlib::kSignalTags), "one flag per IR tag");

namespace {

uint8_t one_sided_kind(OpKind k) {
  switch (k) {
    case OpKind::Copy: return kCopy;
    case OpKind::Reduce: return kReduce;
    case OpKind::Get: return kGet;
    case OpKind::GetReduce: return kGetReduce;
    case OpKind::Put: return kPut;
    case OpKind::Signal: return kSignal;
    case OpKind::Wait: return kWait;
    case OpKind::ReduceToAll: return kReduceToAll;
    case OpKind::ReduceFromAll: return kReduceFromAll;
    default: return 0xff;  // a message: a schedule mixes them with one-sided ops
  }
}

// The kernel's order within a step: waits, data, signals.
int phase(uint8_t kind) { return kind == kWait ? 0 : kind == kSignal ? 2 : 1; }
bool is_data(uint8_t kind) { return phase(kind) == 1; }
bool every_rank(uint8_t kind) { return kind == kReduceToAll || kind == kReduceFromAll; }
bool reads_peer(uint8_t kind) { return kind == kGet || kind == kGetReduce || every_rank(kind); }
bool writes_peer(uint8_t kind) { return kind == kPut || kind == kReduceToAll; }
bool item_reduces(uint8_t kind) { return kind == kReduce || kind == kGetReduce || every_rank(kind); }
bool is_local(uint8_t kind) { return kind == kCopy || kind == kReduce || every_rank(kind); }  // names no peer

}  // namespace

DevicePlan lower_one_sided(const Schedule& sched, int rank, int size, size_t esize) {
  if (esize == 0) throw std::invalid_argument("esize: must be > 0");
  DevicePlan plan;
  plan.one_sided = true;
  plan.esize = esize;
  plan.chunk_bytes = kOneSidedItemBytes;
  plan.sends_to.assign(size, 0);
  plan.recvs_from.assign(size, 0);
  const int64_t e = static_cast<int64_t>(esize);
  for (const Step& st : sched.steps) {
    PlanStep ps;
    ps.first = static_cast<uint32_t>(plan.items.size());
    for (int pass = 0; pass < 3; ++pass) {
      for (const Op& o : st.ops) {
        const uint8_t kind = one_sided_kind(o.kind);
        if (kind == 0xff)
          throw std::invalid_argument(std::string("schedule: a ") + op_kind_name(o.kind) +
                                      " in a one-sided schedule (a schedule uses messages or one-sided operations, never both)");
        if (phase(kind) != pass) continue;
        if (!is_local(kind) && (o.peer < 0 || o.peer >= size || o.peer == rank))
          throw std::invalid_argument("schedule: a " + std::string(op_kind_name(o.kind)) + " with peer " +
                                      std::to_string(o.peer) + " of rank " + std::to_string(rank) + " in a world of " +
                                      std::to_string(size));
        PlanItem it;
        it.kind = kind;
        it.peer = is_local(kind) ? -1 : o.peer;
        if (!is_data(kind)) {
          if (o.tag < 0 || o.tag >= commlib::kSignalTags) throw std::invalid_argument("schedule: a signal tag out of range");
          it.chunk = static_cast<uint32_t>(o.tag);
          (kind == kSignal ? plan.sends_to : plan.recvs_from)[o.peer] += 1;
          plan.items.push_back(it);
          continue;
        }
        if (o.dst.count < 0 || o.dst.offset < 0 || o.src.offset < 0 || o.src.count != o.dst.count)
          throw std::invalid_argument("schedule: a one-sided data operation with a negative or unequal region");
        const uint64_t bytes = static_cast<uint64_t>(o.dst.count) * esize;
        it.dst_buf = static_cast<uint8_t>(o.dst.buf);
        it.src_buf = static_cast<uint8_t>(o.src.buf);
        if (bytes == 0) continue;  // an empty region: no item (what the check expects)
        if (writes_peer(kind)) plan.peer_bufs |= static_cast<uint8_t>(1u << it.dst_buf);
        if (reads_peer(kind)) plan.peer_bufs |= static_cast<uint8_t>(1u << it.src_buf);
        if (item_reduces(kind)) plan.reduces = true;
        for (uint64_t off = 0; off < bytes; off += kOneSidedItemBytes) {
          it.bytes = static_cast<uint32_t>(std::min(kOneSidedItemBytes, bytes - off));
          it.dst_off = o.dst.offset * e + static_cast<int64_t>(off);
          it.src_off = o.src.offset * e + static_cast<int64_t>(off);
          plan.items.push_back(it);
        }
      }
    }
    ps.count = static_cast<uint32_t>(plan.items.size()) - ps.first;
    plan.widest_step = std::max(plan.widest_step, ps.count);
    plan.steps.push_back(ps);
  }
  return plan;
}

namespace {

std::string at_step(size_t k, const std::string& what) { return "step " + std::to_string(k) + ": " + what; }

// Whether item `it` lies inside operation `o`'s regions at the same offset in both.
bool inside(const PlanItem& it, const Op& o, int64_t e) {
  if (one_sided_kind(o.kind) != it.kind || (is_one_sided(o.kind) && o.peer != it.peer)) return false;
  const int64_t d = o.dst.offset * e, s = o.src.offset * e, n = o.dst.count * e;
  const int64_t at = it.dst_off - d;
  return it.dst_buf == static_cast<uint8_t>(o.dst.buf) && it.src_buf == static_cast<uint8_t>(o.src.buf) && at >= 0 &&
         at + static_cast<int64_t>(it.bytes) <= n && it.src_off - s == at && it.bytes > 0 &&
         at % static_cast<int64_t>(kOneSidedItemBytes) == 0;
}

}  // namespace

std::string check_one_sided_plan(const DevicePlan& plan, const Schedule& sched, int rank, int size, size_t esize) {
  if (!plan.one_sided) return "a message plan for a one-sided schedule";
  if (plan.steps.size() != sched.steps.size())
    return "plan has " + std::to_string(plan.steps.size()) + " steps, schedule " + std::to_string(sched.steps.size());
  if (plan.esize != esize) return "plan lowered for another element size";
  if (plan.sends_to.size() != static_cast<size_t>(size) || plan.recvs_from.size() != static_cast<size_t>(size))
    return "per-peer signal totals not of the world's size";
  const int64_t e = static_cast<int64_t>(esize);
  std::vector<uint32_t> signals(size, 0), waits(size, 0);
  uint32_t next = 0, widest = 0;
  bool reduces = false;
  uint8_t peer_bufs = 0;
  for (size_t k = 0; k < sched.steps.size(); ++k) {
    const PlanStep& ps = plan.steps[k];
    if (ps.first != next || static_cast<uint64_t>(ps.first) + ps.count > plan.items.size())
      return at_step(k, "items out of sequence");
    next = ps.first + ps.count;
    widest = std::max(widest, ps.count);
    const Step& st = sched.steps[k];
    // Signals and waits: the same multiset of (kind, peer, tag) as the step's operations.
    std::map<std::tuple<uint8_t, int, uint32_t>, int> syncs;
    for (const Op& o : st.ops)
      if (is_sync(o.kind)) ++syncs[{one_sided_kind(o.kind), o.peer, static_cast<uint32_t>(o.tag)}];
    std::vector<std::vector<const PlanItem*>> of_op(st.ops.size());
    int last_phase = 0;
    for (uint32_t j = ps.first; j < next; ++j) {
      const PlanItem& it = plan.items[j];
      if (it.kind >= kItemKinds || it.kind < kCopy) return at_step(k, "an item of a kind no one-sided plan has");
      if (phase(it.kind) < last_phase) return at_step(k, "items out of the kernel's order (waits, data, signals)");
      last_phase = phase(it.kind);
      if (!is_data(it.kind)) {
        auto f = syncs.find({it.kind, it.peer, it.chunk});
        if (f == syncs.end() || f->second == 0)
          return at_step(k, std::string(it.kind == kSignal ? "a signal" : "a wait") + " with rank " +
                                std::to_string(it.peer) + " (tag " + std::to_string(it.chunk) + ") the schedule does not have");
        --f->second;
        (it.kind == kSignal ? signals : waits)[it.peer] += 1;
        continue;
      }
      if (item_reduces(it.kind)) reduces = true;
      if (writes_peer(it.kind)) peer_bufs |= static_cast<uint8_t>(1u << (it.dst_buf & 7));
      if (reads_peer(it.kind)) peer_bufs |= static_cast<uint8_t>(1u << (it.src_buf & 7));
      size_t o = 0;
      while (o < st.ops.size() && !inside(it, st.ops[o], e)) ++o;
      if (o == st.ops.size()) return at_step(k, "item " + std::to_string(j) + " belongs to no operation of the schedule");
      of_op[o].push_back(&it);
    }
    for (const auto& [key, left] : syncs)
      if (left)
        return at_step(k, std::string(std::get<0>(key) == kSignal ? "the signal to" : "the wait for") + " rank " +
                              std::to_string(std::get<1>(key)) + " (tag " + std::to_string(std::get<2>(key)) +
                              ") is missing from the plan");
    for (size_t o = 0; o < st.ops.size(); ++o) {
      const Op& op = st.ops[o];
      if (is_sync(op.kind)) continue;
      auto& items = of_op[o];
      std::sort(items.begin(), items.end(), [](const PlanItem* a, const PlanItem* b) { return a->dst_off < b->dst_off; });
      int64_t at = op.dst.offset * e;
      for (const PlanItem* it : items) {
        if (it->dst_off != at) return at_step(k, std::string(op_kind_name(op.kind)) + ": a gap or overlap in its items");
        at += it->bytes;
      }
      if (at != (op.dst.offset + op.dst.count) * e)
        return at_step(k, std::string(op_kind_name(op.kind)) + ": its items cover " +
                              std::to_string(at - op.dst.offset * e) + " of " + std::to_string(op.dst.count * e) + " bytes");
    }
  }
  if (next != plan.items.size()) return "items after the last step";
  if (plan.sends_to != signals || plan.recvs_from != waits) return "per-peer signal or wait totals differ from the steps'";
  if (plan.widest_step != widest || plan.reduces != reduces || plan.peer_bufs != peer_bufs)
    return "summary fields differ from the items";
  return "";
}

namespace {

// A byte range of a rank's buffer, in the layout the check compares in (in place: the aliased
// buffers as one).
struct Span {
  uint8_t buf;
  int64_t begin, end;
  bool operator<(const Span& o) const { return std::tie(buf, begin, end) < std::tie(o.buf, o.begin, o.end); }
};

// In place, where the collective aliases input and output (ir.h), the one the other maps onto.
Span aliased(Span s, Collective coll, int owner, int64_t count, int64_t e, bool in_place) {
  if (!in_place) return s;
  const uint8_t in = static_cast<uint8_t>(BufferId::Input), out = static_cast<uint8_t>(BufferId::Output);
  const int64_t shift = static_cast<int64_t>(owner) * count * e;
  if (coll == Collective::AllReduce && s.buf == in) s.buf = out;
  else if (coll == Collective::AllGather && s.buf == in) s = Span{out, s.begin + shift, s.end + shift};
  else if (coll == Collective::ReduceScatter && s.buf == out) s = Span{in, s.begin + shift, s.end + shift};
  return s;
}

}  // namespace

std::string check_one_sided_pairs(const std::vector<DevicePlan>& plans, Collective coll, int64_t count, size_t esize) {
  const int P = static_cast<int>(plans.size());
  // Signals per (from, to, tag) against waits per (at, from, tag).
  std::vector<int64_t> balance(static_cast<size_t>(P) * P * commlib::kSignalTags, 0);
  for (int r = 0; r < P; ++r)
    for (const PlanItem& it : plans[r].items) {
      if (it.kind == kSignal) ++balance[(static_cast<size_t>(r) * P + it.peer) * commlib::kSignalTags + it.chunk];
      if (it.kind == kWait) --balance[(static_cast<size_t>(it.peer) * P + r) * commlib::kSignalTags + it.chunk];
    }
  for (size_t i = 0; i < balance.size(); ++i)
    if (balance[i])
      return "rank " + std::to_string(i / commlib::kSignalTags / P) + " signals rank " + std::to_string(i / commlib::kSignalTags % P) +
             " (tag " + std::to_string(i % commlib::kSignalTags) + ") " + (balance[i] > 0 ? "more" : "fewer") +
             " times than that rank waits for it";
  const int64_t e = static_cast<int64_t>(esize);
  const bool has_in_place = coll == Collective::AllReduce || coll == Collective::AllGather || coll == Collective::ReduceScatter;
  for (int mode = 0; mode < (has_in_place ? 2 : 1); ++mode) {
    std::vector<std::vector<Span>> touched(P);
    for (int r = 0; r < P; ++r)
      for (const PlanItem& it : plans[r].items) {
        if (!is_data(it.kind) || it.bytes == 0) continue;
        const Span d{it.dst_buf, it.dst_off, it.dst_off + it.bytes}, s{it.src_buf, it.src_off, it.src_off + it.bytes};
        if (every_rank(it.kind)) {  // the same ranges of every rank's buffers (reduce_from_all: dst r's only)
          for (int q = 0; q < P; ++q) {
            if (it.kind == kReduceToAll || q == r) touched[q].push_back(aliased(d, coll, q, count, e, mode == 1));
            touched[q].push_back(aliased(s, coll, q, count, e, mode == 1));
          }
          continue;
        }
        const int dst_owner = it.kind == kPut ? it.peer : r, src_owner = reads_peer(it.kind) ? it.peer : r;
        touched[dst_owner].push_back(aliased(d, coll, dst_owner, count, e, mode == 1));
        touched[src_owner].push_back(aliased(s, coll, src_owner, count, e, mode == 1));
      }
    for (int r = 0; r < P; ++r) {
      std::vector<Span>& t = touched[r];
      std::sort(t.begin(), t.end());
      t.erase(std::unique(t.begin(), t.end(), [](const Span& a, const Span& b) { return !(a < b) && !(b < a); }), t.end());
      for (size_t i = 1; i < t.size(); ++i)
        if (t[i].buf == t[i - 1].buf && t[i].begin < t[i - 1].end)
          return std::string("block locality: rank ") + std::to_string(r) + "'s " +
                 buffer_name(static_cast<BufferId>(t[i].buf)) + " bytes [" + std::to_string(t[i - 1].begin) + ", " +
                 std::to_string(t[i - 1].end) + ") and [" + std::to_string(t[i].begin) + ", " + std::to_string(t[i].end) +
                 ") overlap without being one range" + (mode ? " (in place)" : "");
    }
  }
  return "";
}

}  // namespace commlib
