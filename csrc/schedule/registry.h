// The algorithm registry: every builder registers itself (name, collective, properties) from its
// own file, with one COMMLIB_REGISTER_ALGORITHM line; the registry only collects them. The
// executor, the verifier, the bindings (and through them the tests and the bench) enumerate it.
// Python may add builders at run time (commlib.register_algorithm), appended after the built-ins.
//
// Indices: algorithm_index(c, name) is 1 + the name's position in algorithms(c). Calls carry it on
// the wire (CallDesc.algo), so every rank must register the same algorithms in the same order
// (built-ins are ordered by their declared `order`; run-time ones by registration).
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "schedule/ir.h"

namespace commlib {

using Builder = std::function<Schedule(const CollArgs&)>;

// Properties a builder declares, for listings, the bench and the cost models (bit flags).
enum AlgorithmTraits : uint32_t {
  kNoTraits = 0,
  kSmallMessages = 1u << 0,  // latency-bound design (about log P rounds): for small messages
  kLargeMessages = 1u << 1,  // bandwidth-optimal: each rank moves about (P-1)/P of the data
  kPowerOfTwo = 1u << 2,     // fully efficient only at power-of-two world sizes (others fold)
  kUserDefined = 1u << 3,    // registered at run time (from Python)
  // One-sided (ir.h): reads and writes peers' mapped buffers. Only an engine with mapped buffers
  // can run it (none yet: the host executor, the plan kernel and auto refuse or skip it); the
  // verifier proves it and the simulator costs it like any other.
  kOneSided = 1u << 4,
  // Run by the host engine in a way of its own (the "shared" broadcast: one write into shared
  // memory that every rank copies out, host/flag_calls.cc); its schedule is a stand-in another
  // engine would run as such. A device engine's auto never takes it from the host tuning table
  // (stream_calls.cc plan_of: the device's own choice instead, policy/device_auto.h).
  kHostOnly = 1u << 5,
};

// Whether the registered `name` of `c` is one-sided (false for unknown names).
bool algorithm_is_one_sided(Collective c, const std::string& name);
// Whether the registered `name` of `c` is host-engine only (kHostOnly; false for unknown names).
bool algorithm_is_host_only(Collective c, const std::string& name);

struct AlgorithmSpec {
  Collective coll = Collective::AllReduce;
  std::string name;
  Builder build;
  int order = 0;        // built-ins: position among the collective's algorithms (smaller first)
  uint32_t traits = 0;  // AlgorithmTraits
  std::string summary;  // one line, for listings
};

// The most algorithms one collective may have: indices above it are codes of their own in a call's
// description (plan/describe.h: nccl, flags).
constexpr size_t kMaxAlgorithmsPerCollective = 0x7D;

// Adds an algorithm. std::invalid_argument when the name is taken, is "auto", is not a lower-case
// identifier, the collective has no schedules (send/recv) or has kMaxAlgorithmsPerCollective
// already. Run-time registrations (traits with kUserDefined) go after every built-in, in
// registration order.
void register_algorithm(AlgorithmSpec spec);
// Removes a run-time (kUserDefined) algorithm. Only the last one registered for `c` may go, so the
// index of every remaining algorithm stays what the peers know it as.
void unregister_algorithm(Collective c, const std::string& name);

// Registers a builder at load time (static initialisation of its file).
struct AlgorithmRegistrar {
  explicit AlgorithmRegistrar(AlgorithmSpec spec) { register_algorithm(std::move(spec)); }
};

#define COMMLIB_REGISTRY_CONCAT2(a, b) a##b
#define COMMLIB_REGISTRY_CONCAT(a, b) COMMLIB_REGISTRY_CONCAT2(a, b)
// In a builder file, at namespace scope:
//   COMMLIB_REGISTER_ALGORITHM(AllReduce, "ring", all_reduce_ring, 1, kLargeMessages, "...");
#define COMMLIB_REGISTER_ALGORITHM(COLL, NAME, FN, ORDER, TRAITS, SUMMARY)                         \
  static const ::commlib::AlgorithmRegistrar COMMLIB_REGISTRY_CONCAT(commlib_algorithm_, __LINE__)( \
      ::commlib::AlgorithmSpec{::commlib::Collective::COLL, NAME, FN, ORDER, TRAITS, SUMMARY})

// Names registered for a collective, in index order ("auto" is not included).
std::vector<std::string> algorithms(Collective c);
// The registered algorithms of a collective with their properties, in index order.
std::vector<AlgorithmSpec> algorithm_specs(Collective c);
// Whether `name` is registered for `c`.
bool algorithm_registered(Collective c, const std::string& name);
// Increases whenever an algorithm is registered (caches of names refresh on a change).
uint64_t registry_generation();

// Build one rank's schedule with the registered algorithm `algorithm` (resolve "auto" first with
// choose_algorithm, which needs the message size in bytes). Throws std::invalid_argument naming
// `algorithm` when it is unknown or "auto", and naming `rank`/`size`/`count`/`root` when out of
// range.
Schedule build_schedule(const CollArgs& args, const std::string& algorithm);
// The same with `how`'s algorithm, its hierarchical phases and segment replacing args' (ir.h).
Schedule build_schedule(CollArgs args, const Composition& how);

// 0 for "auto", else 1 + the name's position in algorithms(c); unknown names throw
// std::invalid_argument naming `algorithm`.
int algorithm_index(Collective c, const std::string& name);

// The name of index `index` (algorithm_index's numbering); std::invalid_argument when none has it.
std::string algorithm_name(Collective c, int index);

// The registered names as an error message lists them: "ring, recursive_doubling, ..., auto".
std::string expected_algorithms(Collective c);
// Throws std::invalid_argument for a collective without schedules (send, recv) or out of range.
void check_has_schedules(Collective c);

}  // namespace commlib
