// gather / scatter with `root` (relative ranks vr = rank - root mod P):
//   binomial  the subtree of vr is the relative ranks [vr, vr + subtree_size); interior non-roots
//             stage their subtree's blocks in scratch in relative order, so every message is one
//             contiguous region. Children are served in one step (distinct peers). At the root the
//             one child range that wraps past rank P-1 (if any) goes through scratch.
//   linear    the root exchanges one message with every other rank, in one step.
#include "schedule/builders.h"
#include "schedule/registry.h"

namespace commlib {
namespace sched {

namespace {
struct Child {
  int real;      // real rank
  int vstart;    // first relative rank of its subtree
  int len;       // subtree size
};
std::vector<Child> children(int vr, int P, int root) {
  std::vector<Child> c;
  const int top = vr == 0 ? pow2_floor(2 * P - 1) : lowbit(vr);
  for (int mask = top >> 1; mask >= 1; mask >>= 1) {
    const int child = vr + mask;
    if (child >= P) continue;
    c.push_back(Child{pmod(child + root, P), child, std::min(mask, P - child)});
  }
  return c;
}
}  // namespace

Schedule gather_binomial(const CollArgs& a) {
  const int P = a.size, r = a.rank, root = a.root;
  const int64_t n = a.count;
  Schedule s;
  const int vr = pmod(r - root, P);
  const Region in = in_region(0, n);
  const auto kids = children(vr, P, root);
  if (vr != 0) {
    const int parent = pmod(vr - lowbit(vr) + root, P);
    if (kids.empty()) {
      s.steps.push_back(Step{{op_send(parent, in)}});
      return s;
    }
    const int sub = subtree_size(vr, P);
    Step x{{op_copy(scratch_region(0, n), in)}};
    for (const auto& c : kids)
      x.ops.push_back(op_recv(c.real, scratch_region((c.vstart - vr) * n, c.len * n)));
    s.steps.push_back(std::move(x));
    s.steps.push_back(Step{{op_send(parent, scratch_region(0, sub * n))}});
    s.scratch_count = sub * n;
    return s;
  }
  Step x{{op_copy(out_region(r * n, n), in)}};
  Step fix;
  for (const auto& c : kids) {
    const int start = c.real;  // real rank of the subtree's first relative rank
    if (start + c.len <= P) {
      x.ops.push_back(op_recv(c.real, out_region(start * n, c.len * n)));
    } else {
      const int first = P - start, second = c.len - first;
      x.ops.push_back(op_recv(c.real, scratch_region(0, c.len * n)));
      fix.ops.push_back(op_copy(out_region(start * n, first * n), scratch_region(0, first * n)));
      fix.ops.push_back(op_copy(out_region(0, second * n), scratch_region(first * n, second * n)));
      s.scratch_count = c.len * n;
    }
  }
  s.steps.push_back(std::move(x));
  if (!fix.ops.empty()) s.steps.push_back(std::move(fix));
  return s;
}

Schedule gather_linear(const CollArgs& a) {
  const int P = a.size, r = a.rank, root = a.root;
  const int64_t n = a.count;
  Schedule s;
  const Region in = in_region(0, n);
  if (r != root) {
    s.steps.push_back(Step{{op_send(root, in)}});
    return s;
  }
  Step x{{op_copy(out_region(r * n, n), in)}};
  for (int j = 0; j < P; ++j)
    if (j != r) x.ops.push_back(op_recv(j, out_region(j * n, n)));
  s.steps.push_back(std::move(x));
  return s;
}

Schedule scatter_binomial(const CollArgs& a) {
  const int P = a.size, r = a.rank, root = a.root;
  const int64_t n = a.count;
  Schedule s;
  const int vr = pmod(r - root, P);
  const Region out = out_region(0, n);
  const auto kids = children(vr, P, root);
  if (vr != 0) {
    const int parent = pmod(vr - lowbit(vr) + root, P);
    if (kids.empty()) {
      s.steps.push_back(Step{{op_recv(parent, out)}});
      return s;
    }
    const int sub = subtree_size(vr, P);
    s.steps.push_back(Step{{op_recv(parent, scratch_region(0, sub * n))}});
    Step x{{op_copy(out, scratch_region(0, n))}};
    for (const auto& c : kids)
      x.ops.push_back(op_send(c.real, scratch_region((c.vstart - vr) * n, c.len * n)));
    s.steps.push_back(std::move(x));
    s.scratch_count = sub * n;
    return s;
  }
  Step pack;
  Step x{{op_copy(out, in_region(r * n, n))}};
  for (const auto& c : kids) {
    const int start = c.real;
    if (start + c.len <= P) {
      x.ops.push_back(op_send(c.real, in_region(start * n, c.len * n)));
    } else {
      const int first = P - start, second = c.len - first;
      pack.ops.push_back(op_copy(scratch_region(0, first * n), in_region(start * n, first * n)));
      pack.ops.push_back(op_copy(scratch_region(first * n, second * n), in_region(0, second * n)));
      x.ops.push_back(op_send(c.real, scratch_region(0, c.len * n)));
      s.scratch_count = c.len * n;
    }
  }
  if (!pack.ops.empty()) s.steps.push_back(std::move(pack));
  s.steps.push_back(std::move(x));
  return s;
}

Schedule scatter_linear(const CollArgs& a) {
  const int P = a.size, r = a.rank, root = a.root;
  const int64_t n = a.count;
  Schedule s;
  const Region out = out_region(0, n);
  if (r != root) {
    s.steps.push_back(Step{{op_recv(root, out)}});
    return s;
  }
  Step x{{op_copy(out, in_region(r * n, n))}};
  for (int j = 0; j < P; ++j)
    if (j != r) x.ops.push_back(op_send(j, in_region(j * n, n)));
  s.steps.push_back(std::move(x));
  return s;
}

COMMLIB_REGISTER_ALGORITHM(Gather, "binomial", gather_binomial, 1, kSmallMessages,
                           "binomial tree to the root");
COMMLIB_REGISTER_ALGORITHM(Gather, "linear", gather_linear, 2, kLargeMessages,
                           "every rank sends its block to the root");
COMMLIB_REGISTER_ALGORITHM(Scatter, "binomial", scatter_binomial, 1, kSmallMessages,
                           "binomial tree from the root");
COMMLIB_REGISTER_ALGORITHM(Scatter, "linear", scatter_linear, 2, kLargeMessages,
                           "the root sends every rank its block");

}  // namespace sched
}  // namespace commlib
