// auto's policy: which registered algorithm a call runs when it asks for "auto". Order: the
// COMMLIB_ALGO_<COLLECTIVE> override, else the tuning table (measured, commlib/tuning.json), else
// a built-in heuristic from the message size and world size.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

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
// Current value of COMMLIB_ALGO_<COLLECTIVE> ("" when unset).
std::string algorithm_override(Collective c);

// Tuning table (e.g. loaded from a JSON file of measurements). For a call of world size `size`,
// the rows with that exact size are tried in increasing max_bytes order and the first with
// bytes <= max_bytes wins (max_bytes < 0 means no limit); no row -> built-in heuristic.
struct TuningRow {
  int size = 0;
  int64_t max_bytes = -1;
  std::string algorithm;
};
// Replaces the rows of collective c (validates names: std::invalid_argument). Thread-safe.
void set_tuning(Collective c, std::vector<TuningRow> rows);
void clear_tuning();
// Increases on every set_tuning/clear_tuning, so cached "auto" decisions can be dropped.
uint64_t tuning_generation();

}  // namespace commlib
