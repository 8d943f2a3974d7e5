// Contributor sets of the symbolic verifier: which ranks' inputs a value is reduced from.
// A 64-bit mask limited the verifier to 64 ranks; these sets are interned lists of rank intervals,
// so a set is a 32-bit id (equal sets have equal ids) and the sets real algorithms produce (ring
// segments, aligned butterfly blocks, binomial subtrees, prefixes) stay a few intervals long at any
// world size. Unions are cached, since a schedule unites the same pairs on many elements.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "common/flat_map.h"

namespace commlib {
namespace verify {

class RankSets {
 public:
  using Id = uint32_t;
  static constexpr Id kEmpty = 0;
  static constexpr Id kNone = ~Id(0);

  explicit RankSets(int size);
  Id single(int rank) const { return singles_[rank]; }
  Id all() const { return all_; }
  Id unite(Id a, Id b);
  Id intersect(Id a, Id b);
  bool disjoint(Id a, Id b) const;
  int64_t count(Id a) const;
  int first(Id a) const;  // smallest rank of a non-empty set
  std::string str(Id a) const;  // "{0..5,9}"

 private:
  // Set i is the sorted, non-adjacent intervals [lo, hi) stored as pairs in
  // data_[off_[i] .. off_[i+1]).
  Id intern(const std::vector<int32_t>& pairs);
  const int32_t* begin(Id a) const { return data_.data() + off_[a]; }
  const int32_t* end(Id a) const { return data_.data() + off_[a + 1]; }

  std::vector<int32_t> data_;
  std::vector<uint32_t> off_;
  FlatMap by_hash_;              // hash -> newest set with it
  std::vector<Id> same_hash_;                  // set -> older set with its hash (or kNone)
  FlatMap union_cache_;
  std::vector<Id> singles_;
  Id all_ = kEmpty;
  std::vector<int32_t> tmp_;
};

}  // namespace verify
}  // namespace commlib
