// Where a one-sided plan (kernels/one_sided_plan.h) finds its peers' buffers: the interface the
// kernel path consumes (issue #38 item 1), so that any registry of mapped memory can feed it.
//
// For a buffer [ptr, ptr + bytes) of this rank in a call, every rank's corresponding buffer of the
// same call as THIS process addresses it (IPC-mapped), or "not mapped". Two implementations are
// meant: the kernel path's own staging area (StagedPeerBuffers below: symmetric, every rank's at
// the same offset of its kernel region, mapped once when the engines connect), and a registry of
// users' buffers (IPC handles cached per allocation segment, or commlib's symmetric pool), which
// answers only after the ranks agreed on the call's buffers (a peer's pointer is not known here
// otherwise: a symmetric pool answers from the offset, a registry from the handles its ranks
// exchanged for the call). A buffer some peer's plan reads or writes in place must be mapped on
// every rank for the call to take the mapped path; otherwise the kernel path stages it
// (docs/gpu.md, "One-sided plans").
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

namespace commlib {

class PeerBuffers {
 public:
  virtual ~PeerBuffers() = default;
  // Fills out[q] (size entries) with rank q's buffer corresponding to [ptr, ptr + bytes) of this
  // rank, as this process addresses it (out[rank] = ptr), and returns true; false (out unspecified)
  // when some rank's is not mapped here.
  virtual bool peer_addresses(const void* ptr, size_t bytes, std::vector<char*>& out) const = 0;
};

// The kernel path's staging area: `mine` (this rank's, `bytes` long) and every peer's mapping of
// theirs (bases[q]; bases[rank] = mine). Symmetric: a pointer at offset o of mine is every rank's
// base + o.
class StagedPeerBuffers final : public PeerBuffers {
 public:
  StagedPeerBuffers(std::vector<char*> bases, int rank, size_t bytes) : bases_(std::move(bases)), rank_(rank), bytes_(bytes) {}
  bool peer_addresses(const void* ptr, size_t bytes, std::vector<char*>& out) const override {
    const char* p = static_cast<const char*>(ptr);
    const char* mine = bases_[rank_];
    if (!mine || p < mine || bytes > bytes_ || static_cast<size_t>(p - mine) > bytes_ - bytes) return false;
    out.resize(bases_.size());
    for (size_t q = 0; q < bases_.size(); ++q) {
      if (!bases_[q]) return false;
      out[q] = bases_[q] + (p - mine);
    }
    return true;
  }

 private:
  std::vector<char*> bases_;
  int rank_;
  size_t bytes_;
};

}  // namespace commlib
