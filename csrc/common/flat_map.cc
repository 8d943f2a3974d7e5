// FlatMap (flat_map.h).
#include "common/flat_map.h"

#include <algorithm>

namespace commlib {

uint32_t FlatMap::get(uint64_t key) const {
  if (keys_.empty()) return kAbsent;
  const size_t m = keys_.size() - 1;
  for (size_t i = hash_mix(key) & m;; i = (i + 1) & m) {
    if (vals_[i] == kAbsent) return kAbsent;
    if (keys_[i] == key) return vals_[i];
  }
}

void FlatMap::put(uint64_t key, uint32_t value) {
  if (2 * (used_ + 1) > keys_.size()) grow();
  const size_t m = keys_.size() - 1;
  for (size_t i = hash_mix(key) & m;; i = (i + 1) & m) {
    if (vals_[i] == kAbsent) {
      keys_[i] = key;
      vals_[i] = value;
      ++used_;
      return;
    }
    if (keys_[i] == key) {
      vals_[i] = value;
      return;
    }
  }
}

void FlatMap::grow() {
  std::vector<uint64_t> keys = std::move(keys_);
  std::vector<uint32_t> vals = std::move(vals_);
  keys_.assign(std::max<size_t>(64, keys.size() * 2), 0);
  vals_.assign(keys_.size(), kAbsent);
  used_ = 0;
  for (size_t i = 0; i < keys.size(); ++i)
    if (vals[i] != kAbsent) put(keys[i], vals[i]);
}

}  // namespace commlib
