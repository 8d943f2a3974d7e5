// See collective_table.h.
#include "policy/collective_table.h"

#include <stdexcept>
#include <string>

#include "policy/auto_policy.h"

namespace commlib {

void CollectiveSizeTable::replace(const Entries& table) {
  for (const auto& [c, per] : table)
    for (const auto& [size, value] : per) {
      const std::string where =
          std::string(section_) + ": " + collective_name(c) + " world size " + std::to_string(size);
      if (size < 1) throw std::invalid_argument(where + ": the world size must be >= 1");
      if (value < -1)
        throw std::invalid_argument(where + ": " + field_ + " must be -1 (never) or >= 0, got " + std::to_string(value));
    }
  {
    std::lock_guard<std::mutex> lk(mu_);
    entries_ = table;
  }
  bump_tuning_generation();  // a plan built from the old table is dropped at its next call
}

int64_t CollectiveSizeTable::get(Collective c, int size, int64_t none) const {
  std::lock_guard<std::mutex> lk(mu_);
  const auto per = entries_.find(c);
  if (per == entries_.end()) return none;
  const auto it = per->second.find(size);
  return it == per->second.end() ? none : it->second;
}

}  // namespace commlib
