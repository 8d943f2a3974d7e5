// The kernel path's staging area as a one-sided plan (kernels/one_sided_plan.h) addresses it:
// for a buffer [ptr, ptr + bytes) of this rank staged there, every rank's corresponding staging
// bytes as THIS process maps them. Symmetric: every rank's area at the same offset of its kernel
// region, mapped once when the engines connect; `bytes` is KernelPath::staging_capacity(), the
// same bound a staged call's fit is judged by. Users' buffers mapped in place are the registry's
// (device/peer_buffers.h, agreed per call: stream_one_sided.cc).
#pragma once

#include <cstddef>
#include <cstdint>
#include <utility>
#include <vector>

namespace commlib {

// The kernel path's staging area: `mine` (this rank's, `bytes` long) and every peer's mapping of
// theirs (bases[q]; bases[rank] = mine). Symmetric: a pointer at offset o of mine is every rank's
// base + o.
class StagedPeerBuffers {
 public:
  StagedPeerBuffers(std::vector<char*> bases, int rank, size_t bytes) : bases_(std::move(bases)), rank_(rank), bytes_(bytes) {}
  // Fills out[q] (size entries) with rank q's bytes corresponding to [ptr, ptr + bytes) of this
  // rank's area (out[rank] = ptr) and returns true; false when the range is not in the area or some
  // rank's area is not mapped here.
  bool peer_addresses(const void* ptr, size_t bytes, std::vector<char*>& out) const {
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
