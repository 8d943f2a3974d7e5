// A small uint64 -> uint32 hash map for hot interning tables (verifier sets, simulator step shapes).
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

namespace commlib {

// uint64 -> uint32 open-addressing map (linear probing, power-of-two capacity): the verifier
// and the simulator do millions of look-ups at 1000+ ranks, where std::unordered_map's node chasing dominated.
class FlatMap {
 public:
  static constexpr uint32_t kAbsent = ~uint32_t(0);
  uint32_t get(uint64_t key) const;
  void put(uint64_t key, uint32_t value);
  size_t bytes() const { return keys_.capacity() * sizeof(uint64_t) + vals_.capacity() * sizeof(uint32_t); }

 private:
  void grow();
  std::vector<uint64_t> keys_;
  std::vector<uint32_t> vals_;  // kAbsent marks an empty slot
  size_t used_ = 0;
};

// A well-mixed 64-bit hash step (murmur3's finaliser).
inline uint64_t hash_mix(uint64_t x) {
  x = (x ^ (x >> 33)) * 0xff51afd7ed558ccdULL;
  x = (x ^ (x >> 33)) * 0xc4ceb9fe1a85ec53ULL;
  return x ^ (x >> 33);
}

}  // namespace commlib
