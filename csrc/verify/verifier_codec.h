// The verifier with compress= modelled (verifier_codec.cc, docs/compression.md).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "verify/verifier.h"

namespace commlib {

// Verifies `algorithm`'s schedules (both layouts) as the host lowering runs them under a codec:
// results as verify_algorithm requires, and every rank's all_reduce / all_gather output identical
// element by element. `sender_projects` false models a lowering whose senders keep the unencoded
// value (rejected wherever a sent value also stays a result). Returns the name verified; throws
// VerificationError. `host_of` (one host id per rank, or empty: one host) places the ranks for
// topology-aware schedules; with `inter_only` (compress_inter_only) messages between ranks of one
// host travel raw.
std::string verify_compressed(Collective c, const std::string& algorithm, int size, int64_t count,
                              bool sender_projects = true, const std::vector<int>& host_of = {},
                              bool inter_only = false);

}  // namespace commlib
