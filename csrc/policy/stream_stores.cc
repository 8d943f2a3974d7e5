// See stream_stores.h.
#include "policy/stream_stores.h"

#include <mutex>
#include <stdexcept>
#include <string>

#include "policy/auto_policy.h"

namespace commlib {

namespace {
std::mutex g_mu;
std::map<Collective, std::map<int, int64_t>> g_streaming;
}  // namespace

void set_streaming_starts(const std::map<Collective, std::map<int, int64_t>>& table) {
  for (const auto& [c, per] : table)
    for (const auto& [size, bytes] : per) {
      // (named as the tuning file's loader names them: commlib/core/tuning.py)
      const std::string where = "stream: " + std::string(collective_name(c)) + " world size " + std::to_string(size);
      if (size < 1) throw std::invalid_argument(where + ": the world size must be >= 1");
      if (bytes < -1)
        throw std::invalid_argument(where + ": min_bytes must be -1 (never) or >= 0, got " + std::to_string(bytes));
    }
  {
    std::lock_guard<std::mutex> lk(g_mu);
    g_streaming = table;
  }
  bump_tuning_generation();  // a plan built from the old table is dropped at its next call
}

void clear_streaming_starts() { set_streaming_starts({}); }

int64_t streaming_start(Collective c, int size) {
  std::lock_guard<std::mutex> lk(g_mu);
  const auto per = g_streaming.find(c);
  if (per == g_streaming.end()) return kStreamNoEntry;
  const auto it = per->second.find(size);
  return it == per->second.end() ? kStreamNoEntry : it->second;
}

}  // namespace commlib
