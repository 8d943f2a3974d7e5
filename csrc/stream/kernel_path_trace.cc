// COMMLIB_DEVICE_TRACE (issue #38, item 6): the kernel path's per-block, per-step stamps. The
// kernel writes them (kernels/plan_trace.cuh) into one device buffer of kMaxGrid rows, which
// every launch overwrites; trace() reads it back after the caller synchronised, so it shows the
// latest launch (commlib/bench/device_trace.py turns it into the bench's Chrome trace).
#include <vector>

#include "common/params.h"
#include "kernels/plan_trace.cuh"
#include "stream/kernel_path.h"

namespace commlib {

namespace {
constexpr size_t kTraceBytes = static_cast<size_t>(kexec::kMaxGrid) * kexec::kTraceRowWords * sizeof(uint64_t);
}  // namespace

bool device_trace_from_env() { return param_int("COMMLIB_DEVICE_TRACE", 0, 1) != 0; }

uint64_t* KernelPath::trace_buffer() {
  if (!tracing_) return nullptr;
  if (!trace_) {
    trace_ = device_->allocate(kTraceBytes);
    const std::vector<char> zeros(kTraceBytes, 0);
    device_->upload_now(trace_, zeros.data(), kTraceBytes);
  }
  return static_cast<uint64_t*>(trace_);
}

std::vector<KernelPath::TraceRecord> KernelPath::trace() const {
  std::vector<TraceRecord> out;
  if (!trace_) return out;
  std::vector<uint64_t> words(kTraceBytes / sizeof(uint64_t));
  device_->upload_now(words.data(), trace_, kTraceBytes);  // a synchronous copy (either direction)
  const uint32_t grid = static_cast<uint32_t>(words[1] >> 32);  // block 0's header: the latest launch's grid
  for (uint32_t b = 0; b < grid && b < kexec::kMaxGrid; ++b) {
    const uint64_t* row = words.data() + static_cast<size_t>(b) * kexec::kTraceRowWords;
    if ((row[1] >> 32) != grid) continue;  // an older launch's row
    const uint32_t steps = static_cast<uint32_t>(row[1]);
    for (uint32_t k = 0; k < steps; ++k) out.push_back(TraceRecord{b, k, k ? row[1 + k] : row[0], row[2 + k]});
  }
  return out;
}

}  // namespace commlib
