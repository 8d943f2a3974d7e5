// The buffer shapes of every collective, in one table: how many elements each rank's input and
// output hold for a call of `count` (ir.h's per-rank count: the block of all_gather,
// reduce_scatter, all_to_all, gather and scatter), which ranks pass each buffer, and where the
// smaller buffer sits inside the larger one when the call runs in place. The communicator, the
// fast path, the verifier, the Python layer (_C.buffer_shapes) and the bench all read it.
#pragma once

#include <cstdint>

#include "common/types.h"

namespace commlib {

struct BufferShapes {
  int64_t input = 0;   // elements; -1: this rank passes no input (broadcast/scatter off the root)
  int64_t output = 0;  // elements; -1: this rank has no output (reduce/gather off the root)
  // In place, the input is the output's elements [input_at, input_at + input) (all_reduce,
  // broadcast, reduce, all_to_all: the same buffer, 0; all_gather: block `rank`; gather: block
  // `root` at the root) or the output is the input's [output_at, output_at + output)
  // (reduce_scatter, scatter). -1 where it does not apply to this rank.
  int64_t input_at = -1;
  int64_t output_at = -1;
};

// Shapes for one rank. `root` matters only for rooted collectives. Arguments are not validated
// (callers check rank/root ranges first).
BufferShapes buffer_shapes(Collective c, int64_t count, int size, int rank, int root);
// Whether the collective runs in place on the very same buffer (input_at 0 and equal sizes on
// every rank that has both: all_reduce, all_to_all, broadcast, reduce): a call whose input is its
// output is then fine without looking at its shapes.
bool in_place_is_the_same_buffer(Collective c);

}  // namespace commlib
