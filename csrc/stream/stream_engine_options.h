// What a stream engine (stream_engine.h) is made with: its settings as the environment gives them
// when a communicator makes its engine, and the inbox's automatic slot size. Apart from the engine
// so that what configures it reads on its own.
#pragma once

#include <cstdint>
#include <string>

#include "policy/device_auto.h"
#include "stream/device_link.h"

namespace commlib {

struct StreamEngineOptions {
  double timeout_s = 300.0;
  uint64_t slot_bytes = 0;          // COMMLIB_DEVICE_SLOT_BYTES; 0 = auto_slot_bytes(ranks, nslots)
  uint32_t nslots = 4;              // COMMLIB_DEVICE_SLOTS
  int streams = 2;                  // COMMLIB_DEVICE_STREAMS: 2 = sends and receives on their own streams
  DevicePath path = DevicePath::Auto;  // COMMLIB_DEVICE_PATH (stream/kernel_path.h)
  DeviceLinkSetting link = DeviceLinkSetting::Auto;  // COMMLIB_DEVICE_LINK (stream/device_link.h)
  int64_t codec_piece_bytes = 262144;  // COMMLIB_COMPRESS_PIECE_BYTES: compress='s pieces (the host's)
  std::string label;
};
StreamEngineOptions stream_engine_options_from_env(double timeout_s, const std::string& label);

// The inbox slot size when COMMLIB_DEVICE_SLOT_BYTES is 0 (its default): an inbox of about
// kAutoInboxBytes per path whatever the world size, in power-of-two slots between 256 KiB and 4 MiB.
// Why: a chunk's cost is a flag round trip on the kernel path and three driver calls per side on
// the copy path, so large slots move large messages faster (an H100, 4 ranks, 64 MiB all_reduce:
// 256 KiB slots 11.2 ms on the copy path and 2.2 ms on the kernel path, 4 MiB slots 1.4 and 1.3 ms;
// bench/gpu_data), while the inbox grows with the ranks: the budget bounds it.
constexpr uint64_t kAutoInboxBytes = uint64_t{64} << 20;
uint64_t auto_slot_bytes(int ranks, uint32_t nslots);

}  // namespace commlib
