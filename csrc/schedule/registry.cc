// The algorithm registry (registry.h): name -> builder per collective, argument validation,
// "auto" resolution (env override, tuning table, built-in heuristic).
#include "schedule/registry.h"

#include <algorithm>
#include <atomic>
#include <cctype>
#include <cstdlib>
#include <mutex>
#include <stdexcept>

#include "schedule/builders.h"

namespace commlib {

namespace {

using BuildFn = Schedule (*)(const CollArgs&);
struct Entry {
  const char* name;
  BuildFn fn;
};

constexpr int kNumColl = static_cast<int>(Collective::kCount);

const std::vector<Entry>& entries(Collective c) {
  using namespace sched;
  static const std::vector<Entry> table[kNumColl] = {
      /* all_reduce */ {{"ring", all_reduce_ring},
                        {"recursive_doubling", all_reduce_recursive_doubling},
                        {"rabenseifner", all_reduce_rabenseifner},
                        {"direct", all_reduce_direct},
                        {"two_shot", all_reduce_two_shot},
                        {"tree", all_reduce_tree},
                        {"reduce_broadcast", all_reduce_reduce_broadcast},
                        {"hierarchical", all_reduce_hierarchical}},
      /* all_gather */ {{"ring", all_gather_ring},
                        {"recursive_doubling", all_gather_recursive_doubling},
                        {"bruck", all_gather_bruck},
                        {"direct", all_gather_direct},
                        {"hierarchical", all_gather_hierarchical}},
      /* reduce_scatter */ {{"ring", reduce_scatter_ring},
                            {"recursive_halving", reduce_scatter_recursive_halving},
                            {"direct", reduce_scatter_direct},
                            {"hierarchical", reduce_scatter_hierarchical}},
      /* all_to_all */ {{"pairwise", all_to_all_pairwise},
                        {"bruck", all_to_all_bruck},
                        {"direct", all_to_all_direct}},
      /* broadcast */ {{"binomial", broadcast_binomial},
                       {"scatter_allgather", broadcast_scatter_allgather},
                       {"pipeline", broadcast_pipeline},
                       {"direct", broadcast_direct},
                       {"hierarchical", broadcast_hierarchical}},
      /* reduce */ {{"binomial", reduce_binomial}, {"direct", reduce_direct}},
      /* gather */ {{"binomial", gather_binomial}, {"linear", gather_linear}},
      /* scatter */ {{"binomial", scatter_binomial}, {"linear", scatter_linear}},
      /* barrier */ {{"dissemination", barrier_dissemination}, {"linear", barrier_linear}},
      /* send */ {},
      /* recv */ {},
  };
  return table[static_cast<int>(c)];
}

std::string expected_list(Collective c) {
  std::string s;
  for (const auto& e : entries(c)) {
    if (!s.empty()) s += ", ";
    s += e.name;
  }
  return s;
}

void check_collective(Collective c) {
  if (static_cast<int>(c) >= kNumColl)
    throw std::invalid_argument("collective: out of range");
  if (entries(c).empty())
    throw std::invalid_argument(std::string("collective: ") + collective_name(c) +
                                " is point-to-point and has no schedules");
}

const Entry* find(Collective c, const std::string& name) {
  for (const auto& e : entries(c))
    if (name == e.name) return &e;
  return nullptr;
}

[[noreturn]] void unknown(const char* what, Collective c, const std::string& name) {
  throw std::invalid_argument(std::string(what) + ": unknown " + collective_name(c) +
                              " algorithm '" + name + "' (expected one of: " + expected_list(c) +
                              ", auto)");
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

std::vector<std::string> algorithms(Collective c) {
  std::vector<std::string> out;
  if (static_cast<int>(c) >= kNumColl) return out;
  for (const auto& e : entries(c)) out.emplace_back(e.name);
  return out;
}

std::string choose_algorithm(Collective c, const std::string& requested, int64_t bytes, int size) {
  check_collective(c);
  if (requested != "auto") {
    if (!find(c, requested)) unknown("algorithm", c, requested);
    return requested;
  }
  const char* env = std::getenv(env_name(c).c_str());
  return choose_auto(c, env ? env : "", bytes, size);
}

std::string choose_auto(Collective c, const std::string& env_value, int64_t bytes, int size) {
  check_collective(c);
  if (!env_value.empty() && env_value != "auto") {
    if (!find(c, env_value)) unknown(env_name(c).c_str(), c, env_value);
    return env_value;
  }
  {
    std::lock_guard<std::mutex> lk(g_tuning_mu);
    if (g_tuning_any) {
      for (const auto& row : g_tuning[static_cast<int>(c)])
        if (row.size == size && (row.max_bytes < 0 || bytes <= row.max_bytes)) return row.algorithm;
    }
  }
  return heuristic(c, bytes, size);
}

std::string algorithm_override(Collective c) {
  const char* env = std::getenv(env_name(c).c_str());
  return env ? env : "";
}

int algorithm_index(Collective c, const std::string& name) {
  check_collective(c);
  if (name == "auto") return 0;
  const auto& es = entries(c);
  for (size_t i = 0; i < es.size(); ++i)
    if (name == es[i].name) return static_cast<int>(i) + 1;
  unknown("algorithm", c, name);
}

uint64_t tuning_generation() { return g_tuning_generation.load(std::memory_order_acquire); }

void set_tuning(Collective c, std::vector<TuningRow> rows) {
  check_collective(c);
  for (const auto& r : rows) {
    if (!find(c, r.algorithm)) unknown("tuning", c, r.algorithm);
    if (r.size < 1) throw std::invalid_argument("tuning: size must be >= 1");
  }
  std::stable_sort(rows.begin(), rows.end(), [](const TuningRow& a, const TuningRow& b) {
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

Schedule build_schedule(const CollArgs& args, const std::string& algorithm) {
  check_collective(args.coll);
  if (args.size < 1)
    throw std::invalid_argument("size: must be >= 1, got " + std::to_string(args.size));
  if (args.rank < 0 || args.rank >= args.size)
    throw std::invalid_argument("rank: " + std::to_string(args.rank) + " out of range [0, " +
                                std::to_string(args.size) + ")");
  if (args.count < 0)
    throw std::invalid_argument("count: must be >= 0, got " + std::to_string(args.count));
  if (collective_has_root(args.coll) && (args.root < 0 || args.root >= args.size))
    throw std::invalid_argument("root: " + std::to_string(args.root) + " out of range [0, " +
                                std::to_string(args.size) + ")");
  if (args.coll == Collective::Barrier && args.count != 0)
    throw std::invalid_argument("count: barrier takes no data (count must be 0)");
  const Entry* e = nullptr;
  if (algorithm == "auto") {
    e = find(args.coll, choose_algorithm(args.coll, algorithm, args.count, args.size));
  } else {
    e = find(args.coll, algorithm);
    if (!e) unknown("algorithm", args.coll, algorithm);
  }
  CollArgs a = args;
  if (!collective_has_root(a.coll)) a.root = 0;
  return e->fn(a);
}

}  // namespace commlib
