// Lowering a schedule into a device plan, and the checks that a plan is its schedule (see
// device_plan.h). The check is written independently of the lowering: it attributes every item to
// the schedule operation whose regions contain it and checks that the items of each operation tile
// its regions exactly, rather than lowering again and comparing.
#include "kernels/device_plan.h"

#include <algorithm>
#include <map>
#include <stdexcept>
#include <tuple>

#include "schedule/registry.h"

namespace commlib {

using namespace kplan;

namespace {

bool is_message(OpKind k) { return k == OpKind::Send || k == OpKind::Recv || k == OpKind::RecvReduce; }
bool is_message_item(uint8_t k) { return k == kSend || k == kRecv || k == kRecvReduce; }

uint8_t item_kind(OpKind k) {
  switch (k) {
    case OpKind::Send: return kSend;
    case OpKind::Recv: return kRecv;
    case OpKind::RecvReduce: return kRecvReduce;
    case OpKind::Copy: return kCopy;
    case OpKind::Reduce: return kReduce;
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
  for (const Step& st : sched.steps) {
    PlanStep ps;
    ps.first = static_cast<uint32_t>(plan.items.size());
    uint64_t rounds = 0;
    for (const Op& o : st.ops) {
      const Region& r = moved(o);
      if (r.count < 0 || r.offset < 0) throw std::invalid_argument("schedule: a region with a negative offset or count");
      const uint64_t bytes = static_cast<uint64_t>(r.count) * esize;
      if (is_message(o.kind)) {
        if (o.peer < 0 || o.peer >= size || o.peer == rank)
          throw std::invalid_argument("schedule: a message to peer " + std::to_string(o.peer) + " of rank " +
                                      std::to_string(rank) + " in a world of " + std::to_string(size));
        rounds = std::max(rounds, nchunks(bytes));
        continue;
      }
      for (uint64_t off = 0; off < bytes; off += chunk) item(o, off, std::min(chunk, bytes - off), 0);
    }
    for (uint64_t i = 0; i < rounds; ++i) {
      for (int pass = 0; pass < 2; ++pass) {  // chunk i of every send, then of every receive
        for (const Op& o : st.ops) {
          if (!is_message(o.kind) || (o.kind == OpKind::Send) != (pass == 0)) continue;
          const uint64_t bytes = static_cast<uint64_t>(moved(o).count) * esize;
          if (i >= nchunks(bytes)) continue;
          const uint32_t base = (o.kind == OpKind::Send ? plan.sends_to : plan.recvs_from)[o.peer];
          const uint64_t off = i * chunk;
          item(o, bytes ? off : 0, bytes ? std::min(chunk, bytes - off) : 0, base + static_cast<uint32_t>(i));
        }
      }
    }
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
std::string tiles(const std::vector<const PlanItem*>& items, const Range* dst, const Range* src) {
  int64_t at = 0;
  for (const PlanItem* it : items) {
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

std::string check_device_plan(const DevicePlan& plan, const Schedule& sched, int rank, int size, size_t esize) {
  if (plan.steps.size() != sched.steps.size())
    return "plan has " + std::to_string(plan.steps.size()) + " steps, schedule " + std::to_string(sched.steps.size());
  if (plan.esize != esize) return "plan lowered for another element size";
  std::vector<uint32_t> sent(size, 0), received(size, 0);
  uint32_t next_item = 0, widest = 0;
  bool reduces = false;
  for (size_t k = 0; k < sched.steps.size(); ++k) {
    const std::string where = "step " + std::to_string(k) + ": ";
    const PlanStep& ps = plan.steps[k];
    if (ps.first != next_item || ps.first + ps.count > plan.items.size()) return where + "items out of sequence";
    next_item = ps.first + ps.count;
    widest = std::max(widest, ps.count);
    const Step& st = sched.steps[k];
    std::vector<std::vector<const PlanItem*>> of_op(st.ops.size());
    std::map<std::pair<uint8_t, int>, int> message_op;  // (item kind, peer) -> operation (the first one)
    std::vector<int> local_ops;
    for (size_t o = 0; o < st.ops.size(); ++o) {
      if (is_message(st.ops[o].kind))
        message_op.emplace(std::make_pair(item_kind(st.ops[o].kind), st.ops[o].peer), static_cast<int>(o));
      else
        local_ops.push_back(static_cast<int>(o));
    }
    bool seen_message = false;
    std::tuple<uint32_t, int> last_order{0, -1};  // (chunk within the step, send 0 / receive 1)
    for (uint32_t j = ps.first; j < ps.first + ps.count; ++j) {
      const PlanItem& it = plan.items[j];
      if (it.kind > kReduce) return where + "an item of unknown kind";
      if (it.kind == kRecvReduce || it.kind == kReduce) reduces = true;
      if (it.bytes > plan.chunk_bytes) return where + "an item larger than a chunk";
      const bool msg = is_message_item(it.kind);
      if (!msg && seen_message) return where + "a local operation after a message";
      seen_message = seen_message || msg;
      int owner = -1;
      if (msg) {
        auto m = message_op.find(std::make_pair(it.kind, it.peer));
        if (m != message_op.end()) owner = m->second;
      }
      for (size_t lo = 0; lo < local_ops.size() && owner < 0 && !msg; ++lo) {
        const size_t o = static_cast<size_t>(local_ops[lo]);
        const Op& op = st.ops[o];
        if (item_kind(op.kind) != it.kind) continue;
        const Range d = byte_range(op.dst, esize), s = byte_range(op.src, esize);
        if (it.dst_buf == d.buf && it.dst_off >= d.begin && it.dst_off + it.bytes <= d.end && it.src_buf == s.buf &&
            it.src_off - s.begin == it.dst_off - d.begin && it.bytes > 0)
          owner = static_cast<int>(o);
      }
      if (owner < 0) return where + "item " + std::to_string(j) + " belongs to no operation of the schedule";
      of_op[owner].push_back(&it);
      if (msg) {
        const uint32_t base = (it.kind == kSend ? sent : received)[it.peer];
        if (it.chunk < base) return where + "a chunk index from an earlier step";
        const std::tuple<uint32_t, int> order{it.chunk - base, it.kind == kSend ? 0 : 1};
        if (order < last_order) return where + "messages out of the kernel's order (chunk i of sends, then of receives)";
        last_order = order;
      }
    }
    for (size_t o = 0; o < st.ops.size(); ++o) {
      const Op& op = st.ops[o];
      auto& items = of_op[o];
      const std::string what = where + op_kind_name(op.kind) + (op.peer >= 0 ? " with rank " + std::to_string(op.peer) : "") + ": ";
      std::sort(items.begin(), items.end(), [](const PlanItem* a, const PlanItem* b) { return a->chunk < b->chunk || (a->chunk == b->chunk && a->dst_off < b->dst_off); });
      const Range d = byte_range(op.dst, esize), s = byte_range(op.src, esize);
      if (is_message(op.kind)) {
        for (size_t o2 = 0; o2 < o; ++o2)
          if (st.ops[o2].peer == op.peer && (st.ops[o2].kind == OpKind::Send) == (op.kind == OpKind::Send))
            return what + "two messages in one direction with one peer in a step";
        auto& counter = (op.kind == OpKind::Send ? sent : received)[op.peer];
        if (moved(op).count == 0) {
          if (items.size() != 1 || items[0]->bytes != 0) return what + "a zero-byte message must move exactly one chunk";
        } else {
          const std::string t = tiles(items, has_dst(op) ? &d : nullptr, has_src(op) ? &s : nullptr);
          if (!t.empty()) return what + t;
        }
        for (size_t i = 0; i < items.size(); ++i)
          if (items[i]->chunk != counter + i) return what + "chunk indices not consecutive for the pair";
        counter += static_cast<uint32_t>(items.size());
      } else {
        if (moved(op).count == 0) {
          if (!items.empty()) return what + "items for an empty region";
          continue;
        }
        const std::string t = tiles(items, &d, &s);
        if (!t.empty()) return what + t;
      }
    }
  }
  if (next_item != plan.items.size()) return "items after the last step";
  if (plan.sends_to != sent || plan.recvs_from != received) return "per-peer chunk totals differ from the steps'";
  if (plan.widest_step != widest || plan.reduces != reduces) return "summary fields differ from the items";
  return "";
}

void check_device_plans(Collective coll, const std::string& algorithm, int size, int64_t count, int root, size_t esize,
                        uint64_t chunk_bytes) {
  std::vector<DevicePlan> plans;
  plans.reserve(size);
  for (int r = 0; r < size; ++r) {
    const Schedule sched = build_schedule(CollArgs{coll, r, size, count, root}, algorithm);
    plans.push_back(lower_schedule(sched, r, size, esize, chunk_bytes));
    const std::string why = check_device_plan(plans.back(), sched, r, size, esize);
    if (!why.empty())
      throw std::runtime_error("device plan of " + algorithm + " on rank " + std::to_string(r) + " of " +
                               std::to_string(size) + " (count " + std::to_string(count) + "): " + why);
  }
  // Pairs: every chunk rank a sends b is a chunk b receives from a, of the same size.
  std::map<std::tuple<int, int, uint32_t>, uint32_t> sends, recvs;
  for (int r = 0; r < size; ++r)
    for (const PlanItem& it : plans[r].items) {
      if (it.kind == kSend) sends[{r, it.peer, it.chunk}] = it.bytes;
      if (it.kind == kRecv || it.kind == kRecvReduce) recvs[{it.peer, r, it.chunk}] = it.bytes;
    }
  if (sends != recvs) {
    for (const auto& [k, v] : sends) {
      auto it = recvs.find(k);
      if (it == recvs.end() || it->second != v)
        throw std::runtime_error("device plans of " + algorithm + " on " + std::to_string(size) + " ranks: rank " +
                                 std::to_string(std::get<0>(k)) + "'s chunk " + std::to_string(std::get<2>(k)) +
                                 " to rank " + std::to_string(std::get<1>(k)) + " is not received as sent");
    }
    throw std::runtime_error("device plans of " + algorithm + " on " + std::to_string(size) +
                             " ranks: a received chunk that no rank sends");
  }
}

}  // namespace commlib
