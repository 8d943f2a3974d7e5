// The copy path's data operations (copy_path.h): a step's copies and reductions out of the inbox
// and between its own buffers, as COMMLIB_DEVICE_COPY_RECV says. The default (mirror) gates each on
// a device copy of the stop word made just before it on its stream, so a mismatched or failed call
// writes nothing (docs/gpu.md "A mismatched call writes nothing") at one read of host memory per
// operation; the other values are diagnostics of the H200's large-message regression (docs/gpu.md
// "The copy path's large-message regression": gated, the stop word read by every block, was the
// default until session 31: 13x slower at 4 MiB, 52x at 64 MiB).
#include <string>

#include "common/params.h"
#include "stream/copy_path.h"

namespace commlib {

CopyPath::DataOps CopyPath::data_ops_from_env() {
  const std::string v = param_choice("COMMLIB_DEVICE_COPY_RECV", {"gated", "mirror", "ungated", "driver"});
  return v == "driver"    ? DataOps::Driver
         : v == "ungated" ? DataOps::Ungated
         : v == "gated"   ? DataOps::Gated
                          : DataOps::Mirror;
}

const uint64_t* CopyPath::gate(DeviceStream& s) {
  if (data_ops_ == DataOps::Gated) return stop_dev();
  if (data_ops_ != DataOps::Mirror) return nullptr;
  uint64_t* word = mirrors_ + next_mirror_++ % kMirrors;
  device_->copy(word, stop_dev(), sizeof(uint64_t), s);  // the stop word as the stream reaches the operation
  return word;
}

const uint64_t* CopyPath::gate_after_call(DeviceStream& s) {
  return data_ops_ == DataOps::Mirror ? gate(s) : stop_dev();
}

void CopyPath::data_copy(char* dst, const char* src, size_t bytes, DeviceStream& s) {
  if (data_ops_ == DataOps::Driver) device_->copy(dst, src, bytes, s);
  else device_->copy_unless(gate(s), dst, src, bytes, s);
}

void CopyPath::data_reduce(char* dst, const char* src, size_t n, DType dtype, RedOp op, DeviceStream& s) {
  device_->reduce_unless(gate(s), dst, src, n, dtype, op, s);
}

}  // namespace commlib
