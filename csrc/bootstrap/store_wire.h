// commlib's rendezvous store's wire format, as the server defines it (commlib/bootstrap/store_wire.py,
// store_server.py: the protocol is the server's; this is its C++ reading for store_client.h).
//
// Frames are u32_be length || bytes. A request is a one-byte command frame followed by its fields:
// SET key value, GET key timeout(f64_be), CHECK key, HELLO. Replies are one frame: SET b"" (or
// b"refused: why"), GET b"\x01" + value or b"\x00", CHECK b"\x01"/b"\x00", HELLO kHelloReply.
#pragma once

#include <cstddef>
#include <cstdint>

namespace commlib::store_wire {

constexpr uint8_t kSet = 1, kGet = 2, kAdd = 3, kCheck = 4, kHello = 5;
constexpr char kHelloReply[] = "commlib-store/1";
constexpr char kRefused[] = "refused: ";
constexpr size_t kMaxFrame = size_t{4} << 20;  // a key or a value (the server refuses longer)

}  // namespace commlib::store_wire
