// See single_copy.h.
#include "policy/single_copy.h"

#include <algorithm>
#include <mutex>
#include <stdexcept>
#include <unordered_map>

#include "common/params.h"
#include "policy/auto_policy.h"

namespace commlib {

namespace {
std::mutex g_mu;
std::unordered_map<int, std::map<int, SingleCopyCrossover>> g_crossovers;  // by Collective
}  // namespace

SingleCopySetting parse_single_copy(const std::string& value) {
  SingleCopySetting s;
  if (value.empty() || value == "auto") return s;
  if (value == "0") {
    s.mode = SingleCopySetting::Off;
    return s;
  }
  if (value == "1") {
    s.mode = SingleCopySetting::On;
    return s;
  }
  int64_t n = -1;
  try {
    n = parse_byte_count("COMMLIB_CMA", value);
  } catch (const std::exception&) {
  }
  if (n < 2)
    throw std::invalid_argument("COMMLIB_CMA: expected auto, 0, 1 or a message size in bytes (2 or more, e.g. 256K), got '" +
                                value + "'");
  s.mode = SingleCopySetting::Bytes;
  s.min_message = n;
  return s;
}

SingleCopySetting single_copy_setting() { return parse_single_copy(param_string("COMMLIB_CMA")); }

void set_single_copy_crossovers(Collective c, std::map<int, SingleCopyCrossover> entries) {
  for (const auto& [size, x] : entries) {
    // (named as the tuning file's loader names them: commlib/core/tuning.py)
    const std::string where = "single_copy: " + std::string(collective_name(c)) + " world size " + std::to_string(size);
    if (size < 1) throw std::invalid_argument(where + ": the world size must be >= 1");
    if (x.min_call_bytes < -1)
      throw std::invalid_argument(where + ": min_bytes must be -1 (never) or >= 0, got " +
                                  std::to_string(x.min_call_bytes));
    // 2, as COMMLIB_CMA's: a 1-byte message would need a rendezvous per element of a byte type
    if (x.min_message < 2)
      throw std::invalid_argument(where + ": min_message must be >= 2 bytes, got " + std::to_string(x.min_message));
  }
  {
    std::lock_guard<std::mutex> lk(g_mu);
    g_crossovers[static_cast<int>(c)] = std::move(entries);
  }
  // After the table changed: a plan built from the old one is dropped at its next call.
  bump_tuning_generation();
}

void clear_single_copy_crossovers() {
  {
    std::lock_guard<std::mutex> lk(g_mu);
    g_crossovers.clear();
  }
  bump_tuning_generation();
}

SingleCopyCrossover single_copy_crossover(Collective c, int size) {
  std::lock_guard<std::mutex> lk(g_mu);
  const auto per = g_crossovers.find(static_cast<int>(c));
  if (per == g_crossovers.end()) return {};
  const auto it = per->second.find(size);
  return it == per->second.end() ? SingleCopyCrossover{} : it->second;
}

int64_t single_copy_auto_min(Collective c, int64_t call_bytes, int size) {
  return single_copy_auto_min(single_copy_crossover(c, size), call_bytes);
}

int64_t single_copy_min_message(const SingleCopySetting& s, Collective c, int64_t call_bytes, int size) {
  return single_copy_min_message(s, s.mode == SingleCopySetting::Auto ? single_copy_auto_min(c, call_bytes, size)
                                                                      : kSingleCopyNever);
}

}  // namespace commlib
