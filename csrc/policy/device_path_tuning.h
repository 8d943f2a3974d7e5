// The device path's size crossover from the tuning file (issue #25): with COMMLIB_DEVICE_PATH=auto a
// call on device buffers takes the kernel path up to this many bytes per rank and the copy path above.
//
// Precedence, per world size: the tuning file's "device_path" section ({"<P>": {"kernel_max_bytes": N}},
// measured by `commlib tune --device`: the largest size at which the kernel path was not slower than
// the copy path) when it has the communicator's world size, else kKernelPathMaxBytes
// (stream/kernel_path.h). An engine reads it once, when it is created (the same answer before
// connect as after), and its kernel handle carries it: connect refuses ranks whose crossovers differ
// (different tuning files), naming COMMLIB_TUNING.
#pragma once

#include <cstdint>
#include <map>

namespace commlib {

// Replaces every world size's crossover (an empty map: the built-in default everywhere). Thread-safe.
void set_device_path_crossovers(std::map<int, int64_t> kernel_max_bytes);
// The crossover for a communicator of `size` ranks: the tuning file's, else `fallback`.
uint64_t device_path_crossover(int size, uint64_t fallback);

}  // namespace commlib
