// SHA-256 (FIPS 180-4) and HMAC-SHA256 (RFC 2104), for the TCP link's challenge-response handshake.
// Written here rather than linked from OpenSSL so the build needs no crypto development package;
// tests compare both against Python's hashlib/hmac.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <string>

namespace commlib {

using Digest = std::array<uint8_t, 32>;

class Sha256 {
 public:
  Sha256();
  void update(const void* data, size_t n);
  Digest finish();

 private:
  void block(const uint8_t* p);
  uint32_t h_[8];
  uint8_t buf_[64];
  size_t buffered_ = 0;
  uint64_t total_ = 0;
};

Digest hmac_sha256(const std::string& key, const void* msg, size_t n);

// Constant-time comparison: a mismatching MAC must not reveal how many leading bytes matched.
bool digest_equal(const Digest& a, const Digest& b);

// The key connections prove they hold: HMAC-SHA256(COMMLIB_SECRET, "commlib/v1/tcp-handshake"),
// commlib/bootstrap/secret.py's derive_key(secret, "tcp-handshake"), so the raw secret is used for nothing
// else. Empty when COMMLIB_SECRET is unset or empty (Python refuses secrets under 16 bytes first).
std::string link_key_from_env();

}  // namespace commlib
