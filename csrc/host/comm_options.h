// What a communicator is configured with, and the executor settings derived from it and the
// environment.
#pragma once

#include <cstddef>
#include <string>

#include "host/executor.h"

namespace commlib {

struct CommOptions {
  double timeout_s = 300.0;
  int debug = 0;  // 0 off, 1 INFO, 2 TRACE (COMMLIB_DEBUG)
  std::string label;
};

// The executor's options: the communicator's timeout plus the byte-count settings read from the
// environment (COMMLIB_STREAM_BYTES, COMMLIB_COPY_CHUNK_BYTES). A malformed value is an error
// naming the variable.
ExecOptions exec_options(const CommOptions& opts);

}  // namespace commlib
