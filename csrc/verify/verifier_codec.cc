// The verifier's model of compress= (docs/compression.md, "Why every rank ends identical"): a
// message passes through a codec Q, an idempotent projection (decode(encode(Q(v))) = Q(v)),
// tagged on the value's reduction tree. Playing a schedule with the host lowering's rules (a
// sender keeps Q of what it sent, a sum is projected where it is made) and checking that every
// rank's output has the same tree proves the ranks end bitwise identical for that schedule; a
// lowering that forgets the sender's projection is rejected (tests/schedule/test_verify_compressed.py).
#include "policy/auto_policy.h"
#include "schedule/registry.h"
#include "verify/verifier_codec.h"
#include "verify/verifier_replay.h"

namespace commlib {
namespace verify {

// The lowering codes a message in pieces: all_gather's at block boundaries (one contributor per
// piece, here), the others' whole. A piece's key hashes what decides its codes: each element's
// tree, source and contributors, and the piece's length.
void Replay::project(std::vector<Run>& pieces) {
  size_t g0 = 0;
  while (g0 < pieces.size()) {
    size_t g1 = g0 + 1;
    if (c_ == Collective::AllGather)
      while (g1 < pieces.size() && pieces[g1].set == pieces[g0].set) ++g1;
    else
      g1 = pieces.size();
    uint64_t key = 0x51c0dec51c0dec51ULL;
    for (size_t i = g0; i < g1; ++i)
      key = mix64(key ^ mix64(pieces[i].tree ^ (static_cast<uint64_t>(pieces[i].src) << 20) ^
                              (static_cast<uint64_t>(pieces[i].set) << 44) ^ static_cast<uint64_t>(pieces[i].len)));
    // The piece's shape: where it starts (source, contributors) and how long it is.
    int64_t len = 0;
    for (size_t i = g0; i < g1; ++i) len += pieces[i].len;
    const uint64_t shape = mix64((static_cast<uint64_t>(pieces[g0].src) << 24) ^
                                 (static_cast<uint64_t>(pieces[g0].set) << 48) ^ static_cast<uint64_t>(len));
    // Q(Q(v)) = Q(v) when the piece is the one that coded them (the same blocks, the same scales).
    bool already = true;
    for (size_t i = g0; i < g1 && already; ++i) {
      auto it = codec_trees_.find(pieces[i].tree);
      already = pieces[i].src >= 0 && it != codec_trees_.end() && it->second == shape;
    }
    for (size_t i = g0; i < g1; ++i) {
      if (pieces[i].src < 0 || already) continue;  // special values stay what they are
      pieces[i].tree = mix64(pieces[i].tree ^ key);
      codec_trees_[pieces[i].tree] = shape;
    }
    g0 = g1;
  }
}

void Replay::project_inputs() {
  for (int r = 0; r < P_; ++r) {
    const Region in{BufferId::Input, 0, n_};
    ranks_[r].mem.read(abs(r, in), n_, pa_);
    project(pa_);
    ranks_[r].mem.write(abs(r, in), n_, pa_);
  }
}

}  // namespace verify

std::string verify_compressed(Collective c, const std::string& algorithm, int size, int64_t count,
                              bool sender_projects, const std::vector<int>& host_of, bool inter_only) {
  if (c != Collective::AllReduce && c != Collective::ReduceScatter && c != Collective::AllGather)
    throw std::invalid_argument(std::string("collective: compress= applies to all_reduce, reduce_scatter and "
                                            "all_gather, not ") + collective_name(c));
  if (size < 1 || size > kMaxVerifiedRanks)
    throw std::invalid_argument("size: 1.." + std::to_string(kMaxVerifiedRanks) + ", got " + std::to_string(size));
  if (count < 0) throw std::invalid_argument("count: must be >= 0, got " + std::to_string(count));
  if (!host_of.empty() && static_cast<int>(host_of.size()) != size)
    throw std::invalid_argument("host_of: one host per rank (" + std::to_string(size) + "), got " +
                                std::to_string(host_of.size()));
  CollArgs a;
  a.host_of = host_of;
  a.coll = c;
  a.size = size;
  a.count = count;
  const std::string name = resolve_algorithm(CallShape{c, count, 4, 0}, algorithm, algorithm_override(c), size,
                                             host_of, nullptr).algorithm;
  std::vector<Schedule> per_rank(size);
  for (int r = 0; r < size; ++r) {
    a.rank = r;
    per_rank[r] = build_schedule(a, name);
  }
  for (int r = 0; r < size; ++r)
    for (const Step& st : per_rank[r].steps)
      for (const Op& o : st.ops)
        if (o.kind != OpKind::Send && o.kind != OpKind::Recv && o.kind != OpKind::RecvReduce &&
            o.kind != OpKind::Copy && o.kind != OpKind::Reduce)
          throw VerificationError(name + " on rank " + std::to_string(r) + " uses " + op_kind_name(o.kind) +
                                  ": compress= lowers sends and receives only");
  for (bool in_place : {false, true}) {
    verify::Replay replay(c, per_rank, size, count, 0, in_place, name + " compressed");
    replay.set_codec(sender_projects ? verify::Replay::kCodecProjecting : verify::Replay::kCodecForgetful);
    if (inter_only) replay.set_codec_inter_only(host_of.empty() ? std::vector<int>(size, 0) : host_of);
    replay.run();
  }
  return name;
}

}  // namespace commlib
