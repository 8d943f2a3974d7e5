#include "engine/comm_options.h"

#include <cstdlib>
#include <stdexcept>

namespace commlib {

namespace {

// A byte count from the environment (unset: `fallback`); anything but digits is an error naming it.
size_t env_bytes(const char* name, size_t fallback) {
  const char* v = std::getenv(name);
  if (!v) return fallback;
  char* end = nullptr;
  long long b = std::strtoll(v, &end, 10);
  if (!*v || *end || b < 0) throw std::invalid_argument(std::string(name) + ": expected a byte count >= 0, got '" + v + "'");
  return static_cast<size_t>(b);
}

}  // namespace

ExecOptions exec_options(const CommOptions& opts) {
  ExecOptions e;
  e.timeout_s = opts.timeout_s;
  e.stream_bytes = env_bytes("COMMLIB_STREAM_BYTES", e.stream_bytes);
  e.copy_chunk_bytes = env_bytes("COMMLIB_COPY_CHUNK_BYTES", e.copy_chunk_bytes);
  return e;
}

}  // namespace commlib
