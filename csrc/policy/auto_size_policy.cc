// auto's size policy (policy/auto_policy.h): the COMMLIB_ALGO_<COLLECTIVE> override, the tuning table and the
// built-in heuristic.
#include "policy/auto_policy.h"

#include <algorithm>
#include <atomic>
#include <cctype>
#include <mutex>
#include <stdexcept>

#include "common/params.h"
#include "schedule/builders.h"
#include "schedule/registry.h"

namespace commlib {

namespace {

constexpr int kNumColl = static_cast<int>(Collective::kCount);

[[noreturn]] void unknown(const std::string& what, Collective c, const std::string& name) {
  throw std::invalid_argument(what + ": unknown " + collective_name(c) + " algorithm '" + name +
                              "' (expected one of: " + expected_algorithms(c) + ")");
}

// What auto resolves to runs on the host executor or the plan kernel, neither of which runs a
// one-sided schedule (registry.h kOneSided): an override or tuning row naming one is refused.
void check_runnable(const std::string& what, Collective c, const std::string& name) {
  if (algorithm_is_one_sided(c, name))
    throw std::invalid_argument(what + ": " + collective_name(c) + " algorithm '" + name +
                                "' is one-sided (it reads peers' mapped buffers), which no engine runs yet");
}

std::string env_name(Collective c) {
  std::string v = "COMMLIB_ALGO_";
  for (const char* p = collective_name(c); *p; ++p)
    v += static_cast<char>(std::toupper(static_cast<unsigned char>(*p)));
  return v;
}

std::mutex g_tuning_mu;
std::vector<TuningRow> g_tuning[kNumColl];
bool g_tuning_any = false;
std::atomic<uint64_t> g_tuning_generation{0};  // bumped on every change: communicators drop cached choices

std::string heuristic(Collective c, int64_t bytes, int size) {
  const int P = size;
  switch (c) {
    case Collective::AllReduce:
      if (P <= 1) return "ring";
      if (bytes <= 16 * 1024) return "recursive_doubling";
      if (bytes <= 1024 * 1024 && sched::is_pow2(P)) return "rabenseifner";
      return "ring";
    case Collective::AllGather:
      if (bytes * P <= 64 * 1024) return sched::is_pow2(P) ? "recursive_doubling" : "bruck";
      return "ring";
    case Collective::ReduceScatter:
      if (bytes * P <= 64 * 1024 && sched::is_pow2(P)) return "recursive_halving";
      return "ring";
    case Collective::AllToAll:
      if (P >= 8 && bytes <= 1024) return "bruck";
      return "pairwise";
    case Collective::Broadcast:
      if (P <= 2 || bytes <= 64 * 1024) return "binomial";
      return "scatter_allgather";
    case Collective::Reduce: return "binomial";
    case Collective::Gather:
    case Collective::Scatter: return (bytes * P <= 64 * 1024) ? "binomial" : "linear";
    case Collective::Barrier: return "dissemination";
    default: break;
  }
  throw std::invalid_argument(std::string("collective: ") + collective_name(c) +
                              " has no schedules");
}

}  // namespace

std::string builtin_algorithm(Collective c, int64_t bytes, int size) { return heuristic(c, bytes, size); }

std::string choose_algorithm(Collective c, const std::string& requested, int64_t bytes, int size) {
  check_has_schedules(c);
  if (requested != "auto") {
    if (!algorithm_registered(c, requested)) unknown("algorithm", c, requested);
    return requested;
  }
  return choose_auto(c, param_string(env_name(c)), bytes, size);
}

std::string choose_auto(Collective c, const std::string& env_value, int64_t bytes, int size) {
  check_has_schedules(c);
  if (!env_value.empty() && env_value != "auto") {
    if (!algorithm_registered(c, env_value)) unknown(env_name(c), c, env_value);
    check_runnable(env_name(c), c, env_value);
    return env_value;
  }
  std::string tuned;
  if (tuned_algorithm(c, bytes, size, &tuned)) return tuned;
  return heuristic(c, bytes, size);
}

bool tuned_algorithm(Collective c, int64_t bytes, int size, std::string* out, int hosts, bool kernel_path) {
  std::lock_guard<std::mutex> lk(g_tuning_mu);
  if (!g_tuning_any) return false;
  for (const auto& row : g_tuning[static_cast<int>(c)])
    if (row.kernel_path == kernel_path && row.size == size && (hosts <= 0 || row.hosts == hosts) &&
        (row.max_bytes < 0 || bytes <= row.max_bytes)) {
      *out = row.algorithm;
      return true;
    }
  return false;
}

std::string algorithm_override(Collective c) {
  return param_string(env_name(c));
}

uint64_t tuning_generation() { return g_tuning_generation.load(std::memory_order_acquire); }

void bump_tuning_generation() { g_tuning_generation.fetch_add(1, std::memory_order_release); }

void set_tuning(Collective c, std::vector<TuningRow> rows) {
  check_has_schedules(c);
  for (const auto& r : rows) {
    if (!algorithm_registered(c, r.algorithm)) unknown("tuning", c, r.algorithm);
    check_runnable("tuning", c, r.algorithm);
    if (r.size < 1) throw std::invalid_argument("tuning: size must be >= 1");
    if (r.hosts < 1 || r.hosts > r.size) throw std::invalid_argument("tuning: hosts must be in 1..size");
  }
  std::stable_sort(rows.begin(), rows.end(), [](const TuningRow& a, const TuningRow& b) {
    if (a.kernel_path != b.kernel_path) return b.kernel_path;
    if (a.size != b.size) return a.size < b.size;
    // max_bytes < 0 (unbounded) sorts last.
    const bool ua = a.max_bytes < 0, ub = b.max_bytes < 0;
    if (ua != ub) return ub;
    return a.max_bytes < b.max_bytes;
  });
  std::lock_guard<std::mutex> lk(g_tuning_mu);
  g_tuning[static_cast<int>(c)] = std::move(rows);
  g_tuning_any = false;
  for (const auto& t : g_tuning) g_tuning_any = g_tuning_any || !t.empty();
  g_tuning_generation.fetch_add(1, std::memory_order_release);
}

void clear_tuning() {
  std::lock_guard<std::mutex> lk(g_tuning_mu);
  for (auto& t : g_tuning) t.clear();
  g_tuning_any = false;
  g_tuning_generation.fetch_add(1, std::memory_order_release);
}

}  // namespace commlib
