#include "host/comm_options.h"

#include "common/params.h"

namespace commlib {

ExecOptions exec_options(const CommOptions& opts) {
  ExecOptions e;
  e.timeout_s = opts.timeout_s;
  e.stream_bytes = param_bytes("COMMLIB_STREAM_BYTES");
  e.stream_tuned = !param_set("COMMLIB_STREAM_BYTES");  // set: its footprint rule alone (policy/stream_stores.h)
  e.copy_chunk_bytes = param_bytes("COMMLIB_COPY_CHUNK_BYTES");
  e.codec_piece_bytes = param_bytes("COMMLIB_COMPRESS_PIECE_BYTES");
  e.single_copy = single_copy_setting();
  return e;
}

}  // namespace commlib
