// One integer per (collective, world size), replaced whole and read under a lock: the shape of the
// tuning file's "flags" and "stream" sections (policy/flag_cutoff.h, policy/stream_stores.h).
#pragma once

#include <cstdint>
#include <map>
#include <mutex>

#include "common/types.h"

namespace commlib {

class CollectiveSizeTable {
 public:
  using Entries = std::map<Collective, std::map<int, int64_t>>;
  // `section` and `field` name the tuning file's section and an entry's field in errors ("flags",
  // "max_bytes"), as its loader names them (commlib/core/tuning.py).
  CollectiveSizeTable(const char* section, const char* field) : section_(section), field_(field) {}
  // Checks every entry first (world size >= 1, value -1 for never or >= 0; std::invalid_argument naming
  // it), replaces the whole table and bumps the tuning generation (policy/auto_policy.h): every
  // communicator then drops its plans, and each plan reads its call's entry once when it is built.
  void replace(const Entries& table);
  // The entry of (c, size), or `none` without one.
  int64_t get(Collective c, int size, int64_t none) const;

 private:
  const char* section_;
  const char* field_;
  mutable std::mutex mu_;
  Entries entries_;
};

}  // namespace commlib
