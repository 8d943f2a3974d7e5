// Compact schedules (compact.h).
#include "sim/compact.h"

#include <algorithm>

#include "schedule/registry.h"

namespace commlib {
namespace sim {

namespace {
bool op_less(const SimOp& a, const SimOp& b) {
  if (a.kind != b.kind) return a.kind < b.kind;
  if (a.peer != b.peer) return a.peer < b.peer;
  if (a.count != b.count) return a.count < b.count;
  return a.post < b.post;
}
bool op_eq(const SimOp& a, const SimOp& b) {
  return a.kind == b.kind && a.peer == b.peer && a.count == b.count && a.post == b.post;
}

}  // namespace

size_t ShapeTable::bytes() const {
  return ops_.capacity() * sizeof(SimOp) + (off_.capacity() + same_hash_.capacity()) * sizeof(uint32_t) + by_hash_.bytes();
}

uint32_t ShapeTable::intern(std::vector<SimOp>& ops) {
  std::sort(ops.begin(), ops.end(), op_less);
  uint64_t h = 0x9e3779b97f4a7c15ULL + ops.size();
  for (const SimOp& o : ops)
    h = hash_mix(h ^ (static_cast<uint64_t>(static_cast<uint32_t>(o.peer)) << 8 | static_cast<uint64_t>(o.kind)) ^
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
                                    std::vector<int64_t>* scratch) {
  std::vector<Program> programs(size);
  if (scratch) scratch->assign(size, 0);
  CollArgs a;
  a.coll = c;
  a.size = size;
  a.count = count;
  a.root = root;
  a.host_of = host_of;
  a.compose(how);
  std::vector<SimOp> ops;
  for (int r = 0; r < size; ++r) {
    a.rank = r;
    const Schedule s = build_schedule(a, how.algorithm);
    if (scratch) (*scratch)[r] = s.scratch_count;
    Program& prog = programs[r];
    for (const Step& st : s.steps) {
      ops.clear();
      size_t sends = 0;
      for (const Op& o : st.ops) {
        switch (o.kind) {
          case OpKind::Send:  // its place among the step's sends: the order its CPU posts them
            ops.push_back({o.peer, SimKind::Send, static_cast<uint16_t>(std::min<size_t>(sends++, 0xffff)), o.src.count});
            break;
          case OpKind::Recv: ops.push_back({o.peer, SimKind::Recv, 0, o.dst.count}); break;
          case OpKind::RecvReduce: ops.push_back({o.peer, SimKind::RecvReduce, 0, o.dst.count}); break;
          case OpKind::Copy:  // a copy onto itself is skipped by the executor
            if (o.src.buf != o.dst.buf || o.src.offset != o.dst.offset) ops.push_back({-1, SimKind::Copy, 0, o.dst.count});
            break;
          case OpKind::Reduce: ops.push_back({-1, SimKind::Reduce, 0, o.dst.count}); break;
          case OpKind::Get: ops.push_back({o.peer, SimKind::Get, 0, o.dst.count}); break;
          case OpKind::GetReduce: ops.push_back({o.peer, SimKind::GetReduce, 0, o.dst.count}); break;
          case OpKind::Put: ops.push_back({o.peer, SimKind::Put, 0, o.src.count}); break;
          case OpKind::Signal: ops.push_back({o.peer, SimKind::Signal, 0, o.tag}); break;
          case OpKind::Wait: ops.push_back({o.peer, SimKind::Wait, 0, o.tag}); break;
          case OpKind::ReduceToAll:  // every peer's src read and reduced as it comes, the result put into every peer's dst
          case OpKind::ReduceFromAll:  // ... and stored here only
            for (int q = 0; q < size; ++q)
              if (q != r) {
                ops.push_back({q, SimKind::GetReduce, 0, o.src.count});
                if (o.kind == OpKind::ReduceToAll) ops.push_back({q, SimKind::Put, 0, o.dst.count});
              }
            break;
        }
      }
      const uint32_t id = shapes.intern(ops);
      if (!prog.empty() && prog.back().first == id) ++prog.back().second;
      else prog.emplace_back(id, 1u);
    }
    prog.shrink_to_fit();
  }
  return programs;
}

}  // namespace sim
}  // namespace commlib
