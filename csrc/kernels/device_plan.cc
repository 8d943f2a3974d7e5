// Lowering a schedule into a device plan, and the checks that a plan is its schedule (see
// device_plan.h). The check is written independently of the lowering: it attributes every item to
// the schedule operation whose regions contain it and checks that the items of each operation tile
// its regions exactly, rather than lowering again and comparing.
#include "kernels/device_plan.h"

#include <algorithm>
#include <cstdint>
#include <stdexcept>
#include <tuple>

#include "kernels/one_sided_plan.h"
#include "schedule/registry.h"

namespace commlib {

using namespace kplan;

namespace {

bool is_message_item(uint8_t k) { return k == kSend || k == kRecv || k == kRecvReduce; }

uint8_t item_kind(OpKind k) {
  switch (k) {
    case OpKind::Send: return kSend;
    case OpKind::Recv: return kRecv;
    case OpKind::RecvReduce: return kRecvReduce;
    case OpKind::Copy: return kCopy;
    case OpKind::Reduce: return kReduce;
    default: break;  // one-sided: lowered by lower_one_sided
  }
  return kCopy;
}

// The region an operation moves (a send's source, everything else's destination).
const Region& moved(const Op& o) { return o.kind == OpKind::Send ? o.src : o.dst; }

bool has_src(const Op& o) { return o.kind == OpKind::Send || o.kind == OpKind::Copy || o.kind == OpKind::Reduce || reduces_from_src(o); }
bool has_dst(const Op& o) { return o.kind != OpKind::Send; }

}  // namespace

DevicePlan lower_schedule(const Schedule& sched, int rank, int size, size_t esize, uint64_t chunk_bytes) {
  if (esize == 0) throw std::invalid_argument("esize: must be > 0");
  if (uses_one_sided(sched)) return lower_one_sided(sched, rank, size, esize);
  DevicePlan plan;
  plan.esize = esize;
  plan.chunk_bytes = std::max<uint64_t>(chunk_bytes / esize * esize, esize);
  plan.sends_to.assign(size, 0);
  plan.recvs_from.assign(size, 0);
  const uint64_t chunk = plan.chunk_bytes;
  auto nchunks = [&](uint64_t bytes) { return bytes ? (bytes + chunk - 1) / chunk : 1; };
  auto item = [&](const Op& o, uint64_t off, uint64_t n, uint32_t index) {
    PlanItem it;
    it.kind = item_kind(o.kind);
    it.peer = o.peer;
    it.chunk = index;
    it.bytes = static_cast<uint32_t>(n);
    if (has_dst(o)) {
      it.dst_buf = static_cast<uint8_t>(o.dst.buf);
      it.dst_off = o.dst.offset * static_cast<int64_t>(esize) + static_cast<int64_t>(off);
    }
    if (has_src(o)) {
      it.src_buf = static_cast<uint8_t>(o.src.buf);
      it.src_off = o.src.offset * static_cast<int64_t>(esize) + static_cast<int64_t>(off);
    }
    if (it.kind == kRecvReduce || it.kind == kReduce) plan.reduces = true;
    plan.items.push_back(it);
  };
  // A step's messages with one peer in one direction are one stream of chunks, in op order (ir.h:
  // they match in op order), so round i of a step holds chunk i of every pair's stream, sends then
  // receives: the kernel's order (plan_kernel.cuh), whatever the number of messages per pair.
  std::vector<uint32_t> in_step_send(size, 0), in_step_recv(size, 0);  // the step's chunks per pair so far
  std::vector<uint64_t> first;  // per op of the step: its first chunk in its pair's stream
  for (const Step& st : sched.steps) {
    PlanStep ps;
    ps.first = static_cast<uint32_t>(plan.items.size());
    uint64_t rounds = 0;
    first.assign(st.ops.size(), 0);
    for (size_t oi = 0; oi < st.ops.size(); ++oi) {
      const Op& o = st.ops[oi];
      const Region& r = moved(o);
      if (r.count < 0 || r.offset < 0) throw std::invalid_argument("schedule: a region with a negative offset or count");
      const uint64_t bytes = static_cast<uint64_t>(r.count) * esize;
      if (is_message(o.kind)) {
        if (o.peer < 0 || o.peer >= size || o.peer == rank)
          throw std::invalid_argument("schedule: a message to peer " + std::to_string(o.peer) + " of rank " +
                                      std::to_string(rank) + " in a world of " + std::to_string(size));
        uint32_t& in_step = (o.kind == OpKind::Send ? in_step_send : in_step_recv)[o.peer];
        first[oi] = in_step;
        in_step += static_cast<uint32_t>(nchunks(bytes));
        rounds = std::max<uint64_t>(rounds, in_step);
        continue;
      }
      for (uint64_t off = 0; off < bytes; off += chunk) item(o, off, std::min(chunk, bytes - off), 0);
    }
    for (uint64_t i = 0; i < rounds; ++i) {
      for (int pass = 0; pass < 2; ++pass) {  // chunk i of every send stream, then of every receive stream
        for (size_t oi = 0; oi < st.ops.size(); ++oi) {
          const Op& o = st.ops[oi];
          if (!is_message(o.kind) || (o.kind == OpKind::Send) != (pass == 0)) continue;
          const uint64_t bytes = static_cast<uint64_t>(moved(o).count) * esize;
          if (i < first[oi] || i >= first[oi] + nchunks(bytes)) continue;
          const uint32_t base = (o.kind == OpKind::Send ? plan.sends_to : plan.recvs_from)[o.peer];
          const uint64_t off = (i - first[oi]) * chunk;
          item(o, bytes ? off : 0, bytes ? std::min(chunk, bytes - off) : 0, base + static_cast<uint32_t>(i));
        }
      }
    }
    for (const Op& o : st.ops)
      if (is_message(o.kind)) (o.kind == OpKind::Send ? in_step_send : in_step_recv)[o.peer] = 0;
    for (const Op& o : st.ops)
      if (is_message(o.kind))
        (o.kind == OpKind::Send ? plan.sends_to : plan.recvs_from)[o.peer] +=
            static_cast<uint32_t>(nchunks(static_cast<uint64_t>(moved(o).count) * esize));
    ps.count = static_cast<uint32_t>(plan.items.size()) - ps.first;
    plan.widest_step = std::max(plan.widest_step, ps.count);
    plan.steps.push_back(ps);
  }
  return plan;
}

namespace {

// The byte range [begin, end) of buffer `buf`.
struct Range {
  uint8_t buf;
  int64_t begin, end;
};

Range byte_range(const Region& r, size_t esize) {
  const int64_t e = static_cast<int64_t>(esize);
  return Range{static_cast<uint8_t>(r.buf), r.offset * e, (r.offset + r.count) * e};
}

// Whether the items (sorted by offset) cover `dst` (and `src` alongside, when given) exactly.
std::string tiles(const PlanItem* const* first, const PlanItem* const* last, const Range* dst, const Range* src) {
  int64_t at = 0;
  for (const PlanItem* const* p = first; p != last; ++p) {
    const PlanItem* it = *p;
    if (dst && (it->dst_buf != dst->buf || it->dst_off != dst->begin + at)) return "a gap or overlap in the destination";
    if (src && (it->src_buf != src->buf || it->src_off != src->begin + at)) return "a gap or overlap in the source";
    if (!dst && it->dst_buf != kNoBuffer) return "a destination where the operation has none";
    if (!src && it->src_buf != kNoBuffer) return "a source where the operation has none";
    at += it->bytes;
  }
  const Range* r = dst ? dst : src;
  if (r && at != r->end - r->begin) return "covers " + std::to_string(at) + " of " + std::to_string(r->end - r->begin) + " bytes";
  return "";
}

}  // namespace

namespace {

// Scratch of one plan's check, reused across its steps (and across the ranks of a sweep), so the
// check allocates nothing per step: the sweep runs it for every rank of P = 1..64.
struct CheckScratch {
  std::vector<int> send_owner, recv_owner;  // per peer: the step's first message operation with it, or -1
  std::vector<int> send_last, recv_last;    // per peer: the step's last one so far, or -1
  std::vector<int> next_same;               // per operation: the step's next one of its direction and peer, or -1
  std::vector<uint32_t> stream_first;       // per message operation: its first chunk in its pair's stream
  std::vector<int> local_ops;
  std::vector<int> owner;                   // per item of the step: its operation
  std::vector<uint32_t> op_begin;           // per operation: where its items start in `by_op`
  std::vector<const PlanItem*> by_op;       // the step's items grouped by operation
};

std::string step_error(size_t k, const std::string& what) { return "step " + std::to_string(k) + ": " + what; }

std::string op_error(size_t k, const Op& op, const std::string& what) {
  return step_error(k, std::string(op_kind_name(op.kind)) + (op.peer >= 0 ? " with rank " + std::to_string(op.peer) : "") +
                           ": " + what);
}

}  // namespace

std::string check_device_plan(const DevicePlan& plan, const Schedule& sched, int rank, int size, size_t esize) {
  if (uses_one_sided(sched)) return check_one_sided_plan(plan, sched, rank, size, esize);
  if (plan.one_sided) return "a one-sided plan for a message schedule";
  if (plan.steps.size() != sched.steps.size())
    return "plan has " + std::to_string(plan.steps.size()) + " steps, schedule " + std::to_string(sched.steps.size());
  if (plan.esize != esize) return "plan lowered for another element size";
  if (plan.sends_to.size() != static_cast<size_t>(size) || plan.recvs_from.size() != static_cast<size_t>(size))
    return "per-peer chunk totals not of the world's size";
  std::vector<uint32_t> sent(size, 0), received(size, 0);
  CheckScratch sc;
  sc.send_owner.assign(size, -1);
  sc.recv_owner.assign(size, -1);
  sc.send_last.assign(size, -1);
  sc.recv_last.assign(size, -1);
  const uint64_t chunk = std::max<uint64_t>(plan.chunk_bytes, 1);
  auto chunks_of = [&](const Op& op) {  // the chunks a message moves (a zero-byte one: its header)
    const uint64_t bytes = static_cast<uint64_t>(moved(op).count) * esize;
    return static_cast<uint32_t>(bytes ? (bytes + chunk - 1) / chunk : 1);
  };
  uint32_t next_item = 0, widest = 0;
  bool reduces = false;
  for (size_t k = 0; k < sched.steps.size(); ++k) {
    const PlanStep& ps = plan.steps[k];
    if (ps.first != next_item || static_cast<uint64_t>(ps.first) + ps.count > plan.items.size())
      return step_error(k, "items out of sequence");
    next_item = ps.first + ps.count;
    widest = std::max(widest, ps.count);
    const Step& st = sched.steps[k];
    // The step's message operations by (direction, peer): one stream of chunks per pair, in op order.
    sc.local_ops.clear();
    sc.next_same.assign(st.ops.size(), -1);
    sc.stream_first.assign(st.ops.size(), 0);
    std::string bad;
    for (size_t o = 0; o < st.ops.size() && bad.empty(); ++o) {
      const Op& op = st.ops[o];
      if (!is_message(op.kind)) {
        sc.local_ops.push_back(static_cast<int>(o));
        continue;
      }
      if (op.peer < 0 || op.peer >= size || op.peer == rank) bad = op_error(k, op, "a peer out of range");
      else {
        const bool send = op.kind == OpKind::Send;
        int& head = (send ? sc.send_owner : sc.recv_owner)[op.peer];
        int& last = (send ? sc.send_last : sc.recv_last)[op.peer];
        if (head < 0) {
          head = static_cast<int>(o);
        } else {
          sc.next_same[last] = static_cast<int>(o);
          sc.stream_first[o] = sc.stream_first[last] + chunks_of(st.ops[last]);
        }
        last = static_cast<int>(o);
      }
    }
    auto reset_owners = [&] {
      for (const Op& op : st.ops)
        if (is_message(op.kind) && op.peer >= 0 && op.peer < size) {
          (op.kind == OpKind::Send ? sc.send_owner : sc.recv_owner)[op.peer] = -1;
          (op.kind == OpKind::Send ? sc.send_last : sc.recv_last)[op.peer] = -1;
        }
    };
    if (!bad.empty()) return bad;
    // Every item belongs to one operation, and the step's items are in the kernel's order.
    bool seen_message = false;
    std::tuple<uint32_t, int> last_order{0, -1};  // (chunk within the step, send 0 / receive 1)
    sc.owner.assign(ps.count, -1);
    for (uint32_t j = ps.first; j < ps.first + ps.count; ++j) {
      const PlanItem& it = plan.items[j];
      if (it.kind > kReduce) bad = "an item of unknown kind";
      else if (it.bytes > plan.chunk_bytes) bad = "an item larger than a chunk";
      const bool msg = is_message_item(it.kind);
      if (bad.empty() && !msg && seen_message) bad = "a local operation after a message";
      if (!bad.empty()) return reset_owners(), step_error(k, bad);
      if (it.kind == kRecvReduce || it.kind == kReduce) reduces = true;
      seen_message = seen_message || msg;
      int owner = -1;
      if (msg) {
        if (it.peer >= 0 && it.peer < size) {
          // The pair's operation whose part of the stream holds the chunk (a chunk from before the
          // step: the first one's, reported below).
          int o = (it.kind == kSend ? sc.send_owner : sc.recv_owner)[it.peer];
          const uint32_t base = (it.kind == kSend ? sent : received)[it.peer];
          if (it.chunk >= base)
            while (o >= 0 && !(it.chunk - base >= sc.stream_first[o] && it.chunk - base < sc.stream_first[o] + chunks_of(st.ops[o])))
              o = sc.next_same[o];
          if (o >= 0 && item_kind(st.ops[o].kind) == it.kind) owner = o;
        }
      } else {
        auto contains = [&](int o) {
          const Op& op = st.ops[o];
          if (item_kind(op.kind) != it.kind) return false;
          const Range d = byte_range(op.dst, esize), s = byte_range(op.src, esize);
          return it.dst_buf == d.buf && it.dst_off >= d.begin && it.dst_off + it.bytes <= d.end && it.src_buf == s.buf &&
                 it.src_off - s.begin == it.dst_off - d.begin && it.bytes > 0;
        };
        // The previous item's operation first (a lowering emits an operation's chunks together),
        // so a step of many local operations is not searched once per chunk.
        const int previous = j > ps.first ? sc.owner[j - 1 - ps.first] : -1;
        if (previous >= 0 && !is_message(st.ops[previous].kind) && contains(previous)) owner = previous;
        for (size_t lo = 0; lo < sc.local_ops.size() && owner < 0; ++lo)
          if (contains(sc.local_ops[lo])) owner = sc.local_ops[lo];
      }
      if (owner < 0) return reset_owners(), step_error(k, "item " + std::to_string(j) + " belongs to no operation of the schedule");
      sc.owner[j - ps.first] = owner;
      if (msg) {
        const uint32_t base = (it.kind == kSend ? sent : received)[it.peer];
        if (it.chunk < base) return reset_owners(), step_error(k, "a chunk index from an earlier step");
        const std::tuple<uint32_t, int> order{it.chunk - base, it.kind == kSend ? 0 : 1};
        if (order < last_order)
          return reset_owners(), step_error(k, "messages out of the kernel's order (chunk i of sends, then of receives)");
        last_order = order;
      }
    }
    reset_owners();
    // Group the items by operation (a counting sort: stable, so each group keeps the plan's order).
    sc.op_begin.assign(st.ops.size() + 1, 0);
    for (int o : sc.owner) ++sc.op_begin[o + 1];
    for (size_t o = 0; o < st.ops.size(); ++o) sc.op_begin[o + 1] += sc.op_begin[o];
    sc.by_op.assign(ps.count, nullptr);
    {
      std::vector<uint32_t>& fill = sc.op_begin;  // advanced while filling, then restored below
      for (uint32_t j = 0; j < ps.count; ++j) sc.by_op[fill[sc.owner[j]]++] = &plan.items[ps.first + j];
      for (size_t o = st.ops.size(); o > 0; --o) fill[o] = fill[o - 1];
      fill[0] = 0;
    }
    // The items of each operation tile its regions exactly; a message's chunks continue the pair's.
    for (size_t o = 0; o < st.ops.size(); ++o) {
      const Op& op = st.ops[o];
      const auto first = sc.by_op.begin() + sc.op_begin[o], last = sc.by_op.begin() + sc.op_begin[o + 1];
      std::sort(first, last, [](const PlanItem* a, const PlanItem* b) {
        return a->chunk < b->chunk || (a->chunk == b->chunk && a->dst_off < b->dst_off);
      });
      const PlanItem* const* items = sc.by_op.data() + sc.op_begin[o];
      const size_t n = sc.op_begin[o + 1] - sc.op_begin[o];
      const Range d = byte_range(op.dst, esize), s = byte_range(op.src, esize);
      if (is_message(op.kind)) {
        auto& counter = (op.kind == OpKind::Send ? sent : received)[op.peer];
        if (moved(op).count == 0) {
          if (n != 1 || items[0]->bytes != 0) return op_error(k, op, "a zero-byte message must move exactly one chunk");
        } else {
          const std::string t = tiles(items, items + n, has_dst(op) ? &d : nullptr, has_src(op) ? &s : nullptr);
          if (!t.empty()) return op_error(k, op, t);
        }
        for (size_t i = 0; i < n; ++i)
          if (items[i]->chunk != counter + i) return op_error(k, op, "chunk indices not consecutive for the pair");
        counter += static_cast<uint32_t>(n);
      } else {
        if (moved(op).count == 0) {
          if (n != 0) return op_error(k, op, "items for an empty region");
          continue;
        }
        const std::string t = tiles(items, items + n, &d, &s);
        if (!t.empty()) return op_error(k, op, t);
      }
    }
  }
  if (next_item != plan.items.size()) return "items after the last step";
  if (plan.sends_to != sent || plan.recvs_from != received) return "per-peer chunk totals differ from the steps'";
  if (plan.widest_step != widest || plan.reduces != reduces) return "summary fields differ from the items";
  return "";
}

}  // namespace commlib
