// Where a rank's buffers sit in the verifier's per-rank arena: sizes per collective (ir.h) and,
// in the in-place layout, input and output overlapping exactly as the aliased call's memory does.
#pragma once

#include <cstdint>

#include "common/types.h"

namespace commlib {
namespace verify {

struct Layout {
  int64_t size[3];  // indexed by BufferId; -1 = not owned by this rank
  int64_t base[3];
  int64_t arena;
};

Layout make_layout(Collective c, int P, int r, int root, int64_t n, int64_t scratch, bool in_place);

}  // namespace verify
}  // namespace commlib
