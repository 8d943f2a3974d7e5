// See flag_cutoff.h.
#include "policy/flag_cutoff.h"

#include "policy/collective_table.h"

namespace commlib {

namespace {
CollectiveSizeTable& cutoffs() {
  static CollectiveSizeTable t("flags", "max_bytes");
  return t;
}
}  // namespace

void set_flag_cutoffs(const std::map<Collective, std::map<int, int64_t>>& table) { cutoffs().replace(table); }

void clear_flag_cutoffs() { set_flag_cutoffs({}); }

int64_t flag_cutoff(Collective c, int size) { return cutoffs().get(c, size, kFlagsAnySize); }

}  // namespace commlib
