// Buffer sizes and arena placement (verifier_layout.h).
#include "engine/verifier_layout.h"

#include <algorithm>

#include "schedule/ir.h"

namespace commlib {
namespace verify {

// Buffer sizes (ir.h) and arena placement for one rank.
Layout make_layout(Collective c, int P, int r, int root, int64_t n, int64_t scratch, bool in_place) {
  int64_t in = n, out = n;
  const int64_t Pn = static_cast<int64_t>(P) * n;
  int64_t alias_in_at = -1, alias_out_at = -1;  // input at output+x, or output at input+x
  switch (c) {
    case Collective::AllReduce: alias_in_at = 0; break;
    case Collective::AllGather: out = Pn; alias_in_at = static_cast<int64_t>(r) * n; break;
    case Collective::ReduceScatter: in = Pn; alias_out_at = static_cast<int64_t>(r) * n; break;
    case Collective::AllToAll: in = out = Pn; break;
    case Collective::Broadcast:
      if (r != root) in = -1;
      else alias_in_at = 0;
      break;
    case Collective::Reduce:
      if (r != root) out = -1;
      else alias_in_at = 0;
      break;
    case Collective::Gather:
      out = Pn;
      if (r != root) out = -1;
      else alias_in_at = static_cast<int64_t>(root) * n;
      break;
    case Collective::Scatter:
      in = Pn;
      if (r != root) in = -1;
      else alias_out_at = static_cast<int64_t>(root) * n;
      break;
    case Collective::Barrier: in = out = 0; break;
    default: break;
  }
  Layout L;
  const int I = static_cast<int>(BufferId::Input), O = static_cast<int>(BufferId::Output),
            S = static_cast<int>(BufferId::Scratch);
  L.size[I] = in;
  L.size[O] = out;
  L.size[S] = scratch;
  int64_t pos = 0;
  if (in_place && alias_in_at >= 0) {
    L.base[O] = 0;
    L.base[I] = alias_in_at;
    pos = out;
  } else if (in_place && alias_out_at >= 0) {
    L.base[I] = 0;
    L.base[O] = alias_out_at;
    pos = in;
  } else {
    L.base[O] = 0;
    pos = std::max<int64_t>(out, 0);
    L.base[I] = pos;
    pos += std::max<int64_t>(in, 0);
  }
  L.base[S] = pos;
  L.arena = pos + std::max<int64_t>(scratch, 0);
  return L;
}

}  // namespace verify
}  // namespace commlib
