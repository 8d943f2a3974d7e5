// See stream_stores.h.
#include "policy/stream_stores.h"

#include "policy/collective_table.h"

namespace commlib {

namespace {
CollectiveSizeTable& starts() {
  static CollectiveSizeTable t("stream", "min_bytes");
  return t;
}
}  // namespace

void set_streaming_starts(const std::map<Collective, std::map<int, int64_t>>& table) { starts().replace(table); }

void clear_streaming_starts() { set_streaming_starts({}); }

int64_t streaming_start(Collective c, int size) { return starts().get(c, size, kStreamNoEntry); }

}  // namespace commlib
