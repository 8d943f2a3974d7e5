// Compact schedules (compact.h).
#include "sim/compact.h"

#include <algorithm>
#include <stdexcept>
#include <string>

#include "schedule/lanes.h"
#include "schedule/registry.h"

namespace commlib {
namespace sim {

namespace {
bool op_less(const SimOp& a, const SimOp& b) {
  if (sort_class(a.kind) != sort_class(b.kind)) return sort_class(a.kind) < sort_class(b.kind);
  if (a.peer != b.peer) return a.peer < b.peer;
  if (a.nth != b.nth) return a.nth < b.nth;
  if (a.kind != b.kind) return a.kind < b.kind;
  if (a.count != b.count) return a.count < b.count;
  return a.post < b.post;
}
bool op_eq(const SimOp& a, const SimOp& b) {
  return a.kind == b.kind && a.peer == b.peer && a.nth == b.nth && a.count == b.count && a.post == b.post;
}

bool is_receive(SimKind k) { return k == SimKind::Recv || k == SimKind::RecvReduce; }

// Each message's SimOp::nth: its place among the step's messages with its peer in its direction,
// in op order (`ops` is in op order here), so the matching order survives the shape's sort.
// Receives, plain or reducing, are one direction. A stable sort by (direction, peer) keeps op order
// within each pair; a step with one message per pair (most) leaves every nth 0.
void number_messages(std::vector<SimOp>& ops, int rank) {
  auto dir = [](const SimOp& o) { return o.kind == SimKind::Send ? 0 : is_receive(o.kind) ? 1 : 2; };
  size_t sends = 0, receives = 0;  // at most one each (most steps): no pair repeats, nothing to sort
  for (const SimOp& o : ops) (dir(o) == 0 ? sends : dir(o) == 1 ? receives : sends) += dir(o) < 2;
  if (sends <= 1 && receives <= 1) return;
  std::stable_sort(ops.begin(), ops.end(), [&](const SimOp& a, const SimOp& b) {
    return dir(a) != dir(b) ? dir(a) < dir(b) : a.peer < b.peer;
  });
  for (size_t i = 1; i < ops.size(); ++i) {
    const SimOp& prev = ops[i - 1];
    SimOp& o = ops[i];
    if (dir(o) == 2 || dir(o) != dir(prev) || o.peer != prev.peer) continue;
    if (prev.nth == 0xff)
      throw std::invalid_argument("simulate: rank " + std::to_string(rank) + " has more than 256 messages with rank " +
                                  std::to_string(o.peer) + " in one direction in one step");
    o.nth = static_cast<uint8_t>(prev.nth + 1);
  }
}

}  // namespace

size_t ShapeTable::bytes() const {
  return ops_.capacity() * sizeof(SimOp) + (off_.capacity() + same_hash_.capacity()) * sizeof(uint32_t) + by_hash_.bytes();
}

uint32_t ShapeTable::intern(std::vector<SimOp>& ops) {
  std::sort(ops.begin(), ops.end(), op_less);
  uint64_t h = 0x9e3779b97f4a7c15ULL + ops.size();
  for (const SimOp& o : ops)
    h = hash_mix(h ^ (static_cast<uint64_t>(static_cast<uint32_t>(o.peer)) << 8 | static_cast<uint64_t>(o.kind) | static_cast<uint64_t>(o.nth) << 40) ^
                 hash_mix(static_cast<uint64_t>(o.count) ^ static_cast<uint64_t>(o.post) << 48));
  const uint32_t head = by_hash_.get(h);
  for (uint32_t id = head; id != FlatMap::kAbsent; id = same_hash_[id])
    if (static_cast<size_t>(end(id) - begin(id)) == ops.size() && std::equal(ops.begin(), ops.end(), begin(id), op_eq))
      return id;
  const uint32_t id = static_cast<uint32_t>(size());
  ops_.insert(ops_.end(), ops.begin(), ops.end());
  off_.push_back(static_cast<uint32_t>(ops_.size()));
  same_hash_.push_back(head);
  by_hash_.put(h, id);
  return id;
}

std::vector<Program> build_programs(Collective c, const Composition& how, int size, int64_t count, int root,
                                    const std::vector<int>& host_of, ShapeTable& shapes,
                                    std::vector<int64_t>* scratch, int* lanes,
                                    std::vector<std::vector<uint16_t>>* order, int* window,
                                    std::vector<std::vector<int>>* gates) {
  if (scratch) scratch->assign(size, 0);
  CollArgs a;
  a.coll = c;
  a.size = size;
  a.count = count;
  a.root = root;
  a.host_of = host_of;
  a.compose(how);
  const int W = schedule_lanes(a, how.algorithm);
  if (lanes) *lanes = W;
  if (W > 0xffff) throw std::invalid_argument("simulate: " + how.algorithm + " has more than 65535 lanes");
  if (order) order->assign(W > 1 ? size : 0, {});
  if (gates) gates->assign(W > 1 ? size : 0, {});
  std::vector<Program> programs(static_cast<size_t>(size) * W);
  std::vector<SimOp> ops;
  for (int r = 0; r < size; ++r) {
    a.rank = r;
    const Schedule s = build_schedule(a, how.algorithm);
    if (scratch) (*scratch)[r] = s.scratch_count;
    if (window && r == 0) *window = s.window;
    if (W > 1 && order) (*order)[r].reserve(s.steps.size());
    if (W > 1 && gates) intra_window_gates(s, r, host_of, (*gates)[r]);
    for (size_t i = 0; i < s.steps.size(); ++i) {
      const Step& st = s.steps[i];
      if (W > 1 && (st.lane < 0 || st.lane >= W))
        throw std::invalid_argument("simulate: " + how.algorithm + "'s rank " + std::to_string(r) + " step " +
                                    std::to_string(i) + " is in lane " + std::to_string(st.lane) + " of " +
                                    std::to_string(W) + " (verify the schedule)");
      if (W > 1 && order) (*order)[r].push_back(static_cast<uint16_t>(st.lane));
      Program& prog = programs[static_cast<size_t>(r) * W + (W > 1 ? st.lane : 0)];  // one lane: list order
      ops.clear();
      size_t sends = 0;
      for (const Op& o : st.ops) {
        switch (o.kind) {
          case OpKind::Send:  // its place among the step's sends: the order its CPU posts them
            ops.push_back({o.peer, SimKind::Send, 0, static_cast<uint16_t>(std::min<size_t>(sends++, 0xffff)), o.src.count});
            break;
          case OpKind::Recv: ops.push_back({o.peer, SimKind::Recv, 0, 0, o.dst.count}); break;
          case OpKind::RecvReduce: ops.push_back({o.peer, SimKind::RecvReduce, 0, 0, o.dst.count}); break;
          case OpKind::Copy:  // a copy onto itself is skipped by the executor
            if (o.src.buf != o.dst.buf || o.src.offset != o.dst.offset) ops.push_back({-1, SimKind::Copy, 0, 0, o.dst.count});
            break;
          case OpKind::Reduce: ops.push_back({-1, SimKind::Reduce, 0, 0, o.dst.count}); break;
          case OpKind::Get: ops.push_back({o.peer, SimKind::Get, 0, 0, o.dst.count}); break;
          case OpKind::GetReduce: ops.push_back({o.peer, SimKind::GetReduce, 0, 0, o.dst.count}); break;
          case OpKind::Put: ops.push_back({o.peer, SimKind::Put, 0, 0, o.src.count}); break;
          case OpKind::Signal: ops.push_back({o.peer, SimKind::Signal, 0, 0, o.tag}); break;
          case OpKind::Wait: ops.push_back({o.peer, SimKind::Wait, 0, 0, o.tag}); break;
          case OpKind::ReduceToAll:  // every peer's src read and reduced as it comes, the result put into every peer's dst
          case OpKind::ReduceFromAll:  // ... and stored here only
            for (int q = 0; q < size; ++q)
              if (q != r) {
                ops.push_back({q, SimKind::GetReduce, 0, 0, o.src.count});
                if (o.kind == OpKind::ReduceToAll) ops.push_back({q, SimKind::Put, 0, 0, o.dst.count});
              }
            break;
        }
      }
      if (W > 1 && std::any_of(ops.begin(), ops.end(), [](const SimOp& o) { return o.kind >= SimKind::Get; }))
        throw std::invalid_argument("simulate: " + how.algorithm + " has lanes and one-sided ops (lanes are for messages)");
      number_messages(ops, r);
      const uint32_t id = shapes.intern(ops);
      if (!prog.empty() && prog.back().first == id) ++prog.back().second;
      else prog.emplace_back(id, 1u);
    }
  }
  for (Program& prog : programs) prog.shrink_to_fit();
  if (order)
    for (auto& o : *order) o.shrink_to_fit();
  return programs;
}

}  // namespace sim
}  // namespace commlib
