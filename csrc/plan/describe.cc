#include "plan/describe.h"

#include <vector>

#include "common/types.h"
#include "kernels/cpu_codecs.h"
#include "schedule/registry.h"

namespace commlib {

// A registry index must never read as one of the codes of their own (nccl, flags).
static_assert(kMaxAlgorithmsPerCollective < kFlagCallAlgorithmCode && kFlagCallAlgorithmCode < kNcclAlgorithmCode,
              "registry indices stay below the codes of their own");

namespace {

constexpr uint8_t kCollectives = static_cast<uint8_t>(Collective::kCount);
constexpr uint8_t kDTypes = static_cast<uint8_t>(DType::kCount);
constexpr uint8_t kOps = static_cast<uint8_t>(RedOp::kCount);

std::string code(const char* what, unsigned v) { return std::string(what) + " code " + std::to_string(v); }

// Names of `c`'s algorithms; empty for point to point (whose registry has none).
std::vector<std::string> algorithm_names(Collective c) {
  if (c == Collective::Send || c == Collective::Recv) return {};
  return algorithms(c);
}

}  // namespace

std::string describe_call(const CallDesc& d) {
  if (d.coll >= kCollectives)
    return code("collective", d.coll) + " #" + std::to_string(d.seq) + " (" + std::to_string(d.count) + " x " +
           (d.dtype < kDTypes ? dtype_name(static_cast<DType>(d.dtype)) : code("dtype", d.dtype)) + ")";
  const Collective c = static_cast<Collective>(d.coll);
  std::string s = std::string(collective_name(c)) + " #" + std::to_string(d.seq) + " (";
  const unsigned algo = d.algo & ~kDeviceCallAlgoBit;
  if (c != Collective::Send && c != Collective::Barrier && algo) {
    const auto names = algorithm_names(c);
    s += (algo == kNcclAlgorithmCode       ? std::string("nccl")
          : algo == kFlagCallAlgorithmCode ? std::string("flags")
          : algo <= names.size()           ? names[algo - 1]
                                           : code("algorithm", algo)) +
         ", ";
  }
  s += std::to_string(d.count) + " x " +
       (d.dtype < kDTypes ? std::string(dtype_name(static_cast<DType>(d.dtype))) : code("dtype", d.dtype));
  if (collective_reduces(c)) s += ", " + (d.op < kOps ? std::string(op_name(static_cast<RedOp>(d.op))) : code("op", d.op));
  if (collective_has_root(c)) s += ", root " + std::to_string(d.root);
  else if (d.root) s += ", compress=" + codec_tag_text(d.root);
  if (d.algo & kDeviceCallAlgoBit) s += ", on device buffers";
  return s + ")";
}

std::string codec_mismatch_hint(const CallDesc& mine, const CallDesc& theirs) {
  // A rootless collective's root word is its codec (plan/lowering.cc call_desc).
  const bool codec = mine.seq == theirs.seq && mine.coll == theirs.coll &&
                     mine.coll < static_cast<uint8_t>(Collective::kCount) &&
                     !collective_has_root(static_cast<Collective>(mine.coll)) && mine.root != theirs.root;
  return codec ? " (the ranks passed different compress=)" : "";
}

std::string mismatch_message(int me, const CallDesc& mine, int peer, const CallDesc& theirs) {
  const std::string a = "rank " + std::to_string(me), b = "rank " + std::to_string(peer);
  if (theirs.seq == mine.seq) {
    return a + " called " + describe_call(mine) + " but " + b + " called " + describe_call(theirs) +
           codec_mismatch_hint(mine, theirs);
  }
  return a + " is at " + describe_call(mine) + " but " + b + " is already at " + describe_call(theirs) +
         " (the calls between them differ)";
}

}  // namespace commlib
