// The algorithm registry (registry.h): collects what the builder files register and builds
// schedules after validating the arguments.
#include "schedule/registry.h"

#include <algorithm>
#include <atomic>
#include <mutex>
#include <stdexcept>

namespace commlib {

namespace {

constexpr int kNumColl = static_cast<int>(Collective::kCount);

// Function-local statics: builder files register during static initialisation, in any order.
struct Registry {
  std::mutex mu;
  std::vector<AlgorithmSpec> by_coll[kNumColl];
  std::atomic<uint64_t> generation{0};
};

Registry& registry() {
  static Registry r;
  return r;
}

bool has_schedules(Collective c) {
  return static_cast<int>(c) < kNumColl && c != Collective::Send && c != Collective::Recv;
}

bool is_identifier(const std::string& s) {
  if (s.empty() || !(s[0] >= 'a' && s[0] <= 'z')) return false;
  for (char ch : s)
    if (!((ch >= 'a' && ch <= 'z') || (ch >= '0' && ch <= '9') || ch == '_')) return false;
  return true;
}

// A copy of the entry (builders are called without the lock: a Python builder takes the GIL).
bool lookup(Collective c, const std::string& name, AlgorithmSpec* out, int* index) {
  Registry& R = registry();
  std::lock_guard<std::mutex> lk(R.mu);
  const auto& v = R.by_coll[static_cast<int>(c)];
  for (size_t i = 0; i < v.size(); ++i) {
    if (v[i].name == name) {
      if (out) *out = v[i];
      if (index) *index = static_cast<int>(i) + 1;
      return true;
    }
  }
  return false;
}

[[noreturn]] void unknown(Collective c, const std::string& name) {
  throw std::invalid_argument("algorithm: unknown " + std::string(collective_name(c)) + " algorithm '" + name +
                              "' (expected one of: " + expected_algorithms(c) + ")");
}

}  // namespace

void register_algorithm(AlgorithmSpec spec) {
  if (!has_schedules(spec.coll))
    throw std::invalid_argument("collective: " + std::string(collective_name(spec.coll)) + " has no schedules");
  if (!is_identifier(spec.name) || spec.name == "auto")
    throw std::invalid_argument("name: '" + spec.name + "' is not a usable algorithm name (lower-case letters, "
                                "digits and _, not 'auto')");
  if (!spec.build) throw std::invalid_argument("builder: missing for algorithm '" + spec.name + "'");
  Registry& R = registry();
  std::lock_guard<std::mutex> lk(R.mu);
  auto& v = R.by_coll[static_cast<int>(spec.coll)];
  for (const auto& e : v)
    if (e.name == spec.name)
      throw std::invalid_argument("name: " + std::string(collective_name(spec.coll)) + " algorithm '" + spec.name +
                                  "' is already registered");
  if (v.size() >= kMaxAlgorithmsPerCollective)
    throw std::invalid_argument("name: " + std::string(collective_name(spec.coll)) + " has " + std::to_string(v.size()) +
                                " algorithms, the most a call's description can number; '" + spec.name +
                                "' not registered");
  if (spec.traits & kUserDefined) {
    v.push_back(std::move(spec));  // after everything: existing indices never move
  } else {
    auto at = std::upper_bound(v.begin(), v.end(), spec, [](const AlgorithmSpec& a, const AlgorithmSpec& b) {
      const bool ua = a.traits & kUserDefined, ub = b.traits & kUserDefined;
      return ua != ub ? ub : a.order < b.order;
    });
    v.insert(at, std::move(spec));
  }
  R.generation.fetch_add(1, std::memory_order_release);
}

void unregister_algorithm(Collective c, const std::string& name) {
  Registry& R = registry();
  std::lock_guard<std::mutex> lk(R.mu);
  auto& v = has_schedules(c) ? R.by_coll[static_cast<int>(c)] : R.by_coll[0];
  if (!has_schedules(c) || v.empty() || v.back().name != name || !(v.back().traits & kUserDefined))
    throw std::invalid_argument("name: '" + name + "' is not the last algorithm registered from Python for " +
                                collective_name(c) + " (only that one can be removed: indices must not move)");
  v.pop_back();
  R.generation.fetch_add(1, std::memory_order_release);
}

std::vector<std::string> algorithms(Collective c) {
  std::vector<std::string> out;
  if (!has_schedules(c)) return out;
  Registry& R = registry();
  std::lock_guard<std::mutex> lk(R.mu);
  for (const auto& e : R.by_coll[static_cast<int>(c)]) out.push_back(e.name);
  return out;
}

std::vector<AlgorithmSpec> algorithm_specs(Collective c) {
  if (!has_schedules(c)) return {};
  Registry& R = registry();
  std::lock_guard<std::mutex> lk(R.mu);
  return R.by_coll[static_cast<int>(c)];
}

bool algorithm_registered(Collective c, const std::string& name) {
  return has_schedules(c) && lookup(c, name, nullptr, nullptr);
}

bool algorithm_is_one_sided(Collective c, const std::string& name) {
  AlgorithmSpec spec;
  return has_schedules(c) && lookup(c, name, &spec, nullptr) && (spec.traits & kOneSided);
}

bool algorithm_is_host_only(Collective c, const std::string& name) {
  AlgorithmSpec spec;
  return has_schedules(c) && lookup(c, name, &spec, nullptr) && (spec.traits & kHostOnly);
}

uint64_t registry_generation() { return registry().generation.load(std::memory_order_acquire); }

std::string algorithm_name(Collective c, int index) {
  if (has_schedules(c) && index >= 1) {
    Registry& R = registry();
    std::lock_guard<std::mutex> lk(R.mu);
    const auto& v = R.by_coll[static_cast<int>(c)];
    if (static_cast<size_t>(index) <= v.size()) return v[index - 1].name;
  }
  throw std::invalid_argument("algorithm: index " + std::to_string(index) + " out of range for " +
                              (static_cast<int>(c) < kNumColl ? collective_name(c) : "this collective"));
}

std::string expected_algorithms(Collective c) {
  std::string s;
  for (const auto& n : algorithms(c)) s += n + ", ";
  return s + "auto";
}

void check_has_schedules(Collective c) {
  if (static_cast<int>(c) >= kNumColl) throw std::invalid_argument("collective: out of range");
  if (!has_schedules(c))
    throw std::invalid_argument(std::string("collective: ") + collective_name(c) +
                                " is point-to-point and has no schedules");
}

int algorithm_index(Collective c, const std::string& name) {
  check_has_schedules(c);
  if (name == "auto") return 0;
  int index = 0;
  if (!lookup(c, name, nullptr, &index)) unknown(c, name);
  return index;
}

Schedule build_schedule(const CollArgs& args, const std::string& algorithm) {
  check_has_schedules(args.coll);
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
  if (algorithm == "auto")
    throw std::invalid_argument("algorithm: build_schedule needs a registered name; resolve 'auto' with "
                                "choose_algorithm (from the message size in bytes) first");
  AlgorithmSpec spec;
  if (!lookup(args.coll, algorithm, &spec, nullptr)) unknown(args.coll, algorithm);
  CollArgs a = args;
  if (!collective_has_root(a.coll)) a.root = 0;
  return spec.build(a);
}

Schedule build_schedule(CollArgs args, const Composition& how) {
  args.compose(how);
  return build_schedule(args, how.algorithm);
}

}  // namespace commlib
