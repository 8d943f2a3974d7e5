// auto's policy, in the engine, where the links are known: which algorithm a call gets when the
// user asked for "auto". Two parts: the size policy (auto_size_policy.cc: the
// COMMLIB_ALGO_<COLLECTIVE> override, else the tuning table measured into commlib/core/tuning.json, else a
// built-in heuristic from bytes and world size), which the verifier and the simulator also use, and
// the link-kind rule (auto_policy.cc), keyed by the kinds of link the communicator's ranks are
// joined by.
//
// Within one host (every peer over shm) the registry's size/bytes policy applies (tuning table,
// then built-in heuristic, schedule/registry.h). When ranks span several hosts and some host holds
// several ranks, collectives with a hierarchical schedule use it: it moves every byte across the
// slow inter-host links as few times as possible (measured: bench/RESULTS_multihost.md). With one
// rank per host every link is TCP and the single-host policy's choice stands. COMMLIB_ALGO_<COLL>
// overrides all of this.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "common/types.h"
#include "common/topology.h"
#include "schedule/ir.h"

namespace commlib {


// Resolve "auto" (and the COMMLIB_ALGO_<COLLECTIVE> override) to a registered name, from the
// message size in bytes and the world size. Non-"auto" names are returned unchanged (after
// checking they are registered). `bytes` is `count` (ir.h meaning: per-rank block for all_gather,
// reduce_scatter, all_to_all, gather, scatter) times the element size.
// Order: requested name if not "auto"; else $COMMLIB_ALGO_<COLLECTIVE> (e.g.
// COMMLIB_ALGO_ALL_REDUCE=ring; "auto" or empty = unset; an unknown name throws
// std::invalid_argument naming the variable); else the tuning table; else a built-in heuristic.
std::string choose_algorithm(Collective c, const std::string& requested, int64_t bytes, int size);

// The "auto" branch of choose_algorithm with the override's value given (empty: unset), for
// callers that read COMMLIB_ALGO_<COLLECTIVE> once (a communicator reads it when created).
std::string choose_auto(Collective c, const std::string& env_value, int64_t bytes, int size);
// The built-in heuristic alone (no override, no tuning table): from bytes and world size.
std::string builtin_algorithm(Collective c, int64_t bytes, int size);
// The tuning table's row for this call, if it has one (true and *out set). `hosts` > 0: only rows
// measured on that many hosts (TuningRow::hosts); 0: any row of this world size. `kernel_path`:
// the rows measured on the device's kernel path (TuningRow::kernel_path) instead of the others.
bool tuned_algorithm(Collective c, int64_t bytes, int size, std::string* out, int hosts = 0, bool kernel_path = false);
// Current value of COMMLIB_ALGO_<COLLECTIVE> ("" when unset).
std::string algorithm_override(Collective c);

// Tuning table (e.g. loaded from a JSON file of measurements). For a call of world size `size`,
// the rows with that exact size are tried in increasing max_bytes order and the first with
// bytes <= max_bytes wins (max_bytes < 0 means no limit); no row -> built-in heuristic.
// `hosts`: how many hosts the row's world size was measured (or simulated) on. A table measured on
// one machine says nothing about the same world size spread over hosts joined by a network, so the
// cost model (resolve_algorithm) only defers to rows of the communicator's own host count.
struct TuningRow {
  int size = 0;
  int64_t max_bytes = -1;
  std::string algorithm;
  int hosts = 1;
  // Measured on the device's kernel path (the tuning file's "kernel_path" section): only the kernel
  // path's auto reads these rows (policy/device_auto.h); host and copy-path calls never do.
  bool kernel_path = false;
};
// Replaces the rows of collective c (validates names: std::invalid_argument). Thread-safe.
void set_tuning(Collective c, std::vector<TuningRow> rows);
void clear_tuning();
// Increases on every set_tuning/clear_tuning, so cached "auto" decisions can be dropped.
uint64_t tuning_generation();
// Increases it for another table a plan reads when it is built (the single_copy crossovers,
// policy/single_copy.h): called after that table changed.
void bump_tuning_generation();

// -- the link-kind rule ------------------------------------------------------------------------

struct LinkProfile {
  bool crosses_hosts = false;  // some peer is reached over TCP
  bool shares_hosts = false;   // some host holds two or more ranks (shm links exist)
};

LinkProfile link_profile(const Topology& topo);

std::string choose_auto_for_links(Collective c, const std::string& env_value, int64_t bytes, int size,
                                  const LinkProfile& links);

// -- the one resolution of a call's algorithm (auto_policy_model.cc) -----------------------------
// The plan cache, the stream engine, the verifier and the simulator all resolve through
// resolve_algorithm. For "auto" with a cost model (a sim::Topology: link parameters, the placement
// taken from host_of) and ranks on two hosts or more, in order:
//   1. COMMLIB_ALGO_<COLLECTIVE> (env_value);
//   2. the measured tuning table, where it has a row for this world size, byte count and number of
//      hosts (a table measured on one machine does not apply across hosts: TuningRow::hosts);
//   3. the candidate the simulator predicts fastest: every registered built-in algorithm, and
//      where some host holds several ranks, hierarchical with each inter-host algorithm (the
//      built-in exchange and every flat algorithm of the collective).
// Without a model, or on one host: choose_auto_for_links (override, link-kind rule, tuning
// table, built-in heuristic), as before the model existed.
// A requested "hierarchical" takes its inter-host algorithm from step 3's ranking of the
// hierarchical candidates when there is a model (else the built-in exchange).

namespace sim {
struct Topology;
}

struct CallShape {
  Collective coll = Collective::AllReduce;
  int64_t count = 0;  // elements, ir.h's meaning
  int elem_bytes = 1;
  int root = 0;
  // The builders' arguments for this call on ranks placed by `host_of` (rank fields left 0).
  CollArgs args_on(const std::vector<int>& host_of) const {
    CollArgs a;
    a.coll = coll;
    a.size = static_cast<int>(host_of.size());
    a.count = count;
    a.root = collective_has_root(coll) ? root : 0;
    a.host_of = host_of;
    return a;
  }
};

// What auto chose (a registered algorithm; hierarchical: its inter- and intra-host algorithms, ""
// the built-in exchanges, and all_reduce's pipeline segment in elements) and how it chose it.
struct AlgorithmChoice : Composition {
  double predicted_s = -1;      // the cost model's prediction when the model decided, else -1
  std::string source;           // "requested", "override", "tuning", "model", "links", "size"
};

// `size`: the world size; `host_of`: every rank's host (empty: one host); `model` may be null.
// `ranked` (optional) receives the candidates with their predictions when the model decided.
AlgorithmChoice resolve_algorithm(const CallShape& call, const std::string& requested, const std::string& env_value,
                                  int size, const std::vector<int>& host_of, const sim::Topology* model,
                                  std::vector<AlgorithmChoice>* ranked = nullptr);

// Every candidate step 3 ranks, with the model's prediction (seconds), in registry order, the
// hierarchical ones after the flat ones.
std::vector<AlgorithmChoice> predict_candidates(const CallShape& call, const std::vector<int>& host_of,
                                                const sim::Topology& model);

// What the simulator plays for a call requested as `requested` on `model` (its callers resolve
// through this, so the cost model stays a leaf under the policy): "auto" resolved by
// resolve_algorithm with the model's placement and the model itself (COMMLIB_ALGO_<COLLECTIVE>
// read now), whose choice replaces requested's phases and segment; any other name as requested,
// a segment < 0 being COMMLIB_HIER_SEGMENT. Checks the call as sim::simulate does first
// (std::invalid_argument naming the argument).
Composition resolve_on_model(Collective c, const Composition& requested, int64_t count, int elem_bytes, int root,
                             const sim::Topology& model);

// A shared copy of a cost model, for an engine to keep (engines hold the model without including the
// simulator: only the policy depends on it).
std::shared_ptr<const sim::Topology> share_cost_model(const sim::Topology& model);

// COMMLIB_HIER_SEGMENT (elements per pipeline segment of hierarchical all_reduce).
int64_t hier_segment_setting();

// One line for COMMLIB_DEBUG=INFO: what auto chose for a shape, and why.
std::string describe_choice(const CallShape& call, int size, const AlgorithmChoice& choice);

}  // namespace commlib
