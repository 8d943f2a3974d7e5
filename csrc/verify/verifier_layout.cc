// Buffer sizes and arena placement (verifier_layout.h).
#include "verify/verifier_layout.h"

#include <algorithm>

#include "common/shapes.h"
#include "schedule/ir.h"

namespace commlib {
namespace verify {

// Buffer sizes and in-place aliasing (common/shapes.h) and arena placement for one rank.
Layout make_layout(Collective c, int P, int r, int root, int64_t n, int64_t scratch, bool in_place) {
  const BufferShapes shapes = buffer_shapes(c, n, P, r, root);
  const int64_t in = shapes.input, out = shapes.output;
  // all_to_all runs in place from a private copy of the input (the communicator makes it), so its
  // schedules are proven for distinct buffers only.
  const bool aliases = c != Collective::AllToAll;
  const int64_t alias_in_at = aliases ? shapes.input_at : -1;    // input at output+x
  const int64_t alias_out_at = aliases ? shapes.output_at : -1;  // output at input+x
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
