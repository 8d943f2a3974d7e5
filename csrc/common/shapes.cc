#include "common/shapes.h"

namespace commlib {

namespace {

enum class Extent : uint8_t { Count, SizeTimesCount, Nothing };
enum class Holder : uint8_t { Every, RootOnly };
enum class Alias : uint8_t { None, Same, InputInOutputAtRank, OutputInInputAtRank, InputInOutputAtRoot,
                             OutputInInputAtRoot };

struct ShapeRule {
  Extent input, output;
  Holder input_holder, output_holder;
  Alias in_place;
};

// Indexed by Collective.
constexpr ShapeRule kRules[] = {
    /* all_reduce */ {Extent::Count, Extent::Count, Holder::Every, Holder::Every, Alias::Same},
    /* all_gather */ {Extent::Count, Extent::SizeTimesCount, Holder::Every, Holder::Every, Alias::InputInOutputAtRank},
    /* reduce_scatter */ {Extent::SizeTimesCount, Extent::Count, Holder::Every, Holder::Every, Alias::OutputInInputAtRank},
    /* all_to_all */ {Extent::SizeTimesCount, Extent::SizeTimesCount, Holder::Every, Holder::Every, Alias::Same},
    /* broadcast */ {Extent::Count, Extent::Count, Holder::RootOnly, Holder::Every, Alias::Same},
    /* reduce */ {Extent::Count, Extent::Count, Holder::Every, Holder::RootOnly, Alias::Same},
    /* gather */ {Extent::Count, Extent::SizeTimesCount, Holder::Every, Holder::RootOnly, Alias::InputInOutputAtRoot},
    /* scatter */ {Extent::SizeTimesCount, Extent::Count, Holder::RootOnly, Holder::Every, Alias::OutputInInputAtRoot},
    /* barrier */ {Extent::Nothing, Extent::Nothing, Holder::Every, Holder::Every, Alias::None},
    /* send */ {Extent::Count, Extent::Nothing, Holder::Every, Holder::Every, Alias::None},
    /* recv */ {Extent::Nothing, Extent::Count, Holder::Every, Holder::Every, Alias::None},
};
static_assert(sizeof(kRules) / sizeof(kRules[0]) == static_cast<size_t>(Collective::kCount),
              "one shape rule per collective");

int64_t elements(Extent e, int64_t count, int size) {
  switch (e) {
    case Extent::Count: return count;
    case Extent::SizeTimesCount: return count * size;
    default: return 0;
  }
}

}  // namespace

BufferShapes buffer_shapes(Collective c, int64_t count, int size, int rank, int root) {
  const ShapeRule& r = kRules[static_cast<int>(c)];
  const bool is_root = rank == root;
  BufferShapes s;
  s.input = (r.input_holder == Holder::RootOnly && !is_root) ? -1 : elements(r.input, count, size);
  s.output = (r.output_holder == Holder::RootOnly && !is_root) ? -1 : elements(r.output, count, size);
  if (s.input < 0 || s.output < 0) return s;  // one buffer only: nothing to alias
  switch (r.in_place) {
    case Alias::Same: s.input_at = 0; break;
    case Alias::InputInOutputAtRank: s.input_at = rank * count; break;
    case Alias::OutputInInputAtRank: s.output_at = rank * count; break;
    case Alias::InputInOutputAtRoot: s.input_at = root * count; break;
    case Alias::OutputInInputAtRoot: s.output_at = root * count; break;
    default: break;
  }
  return s;
}

bool in_place_is_the_same_buffer(Collective c) {
  const ShapeRule& r = kRules[static_cast<int>(c)];
  return r.in_place == Alias::Same && r.input == r.output;
}

}  // namespace commlib
