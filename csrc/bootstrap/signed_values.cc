// Signed store values (signed_values.h): secret.py's sign_value and verify_value.
#include "bootstrap/signed_values.h"

#include <arpa/inet.h>

#include <cstring>

#include "bootstrap/store_error.h"
#include "transport/tcp/hmac_sha256.h"

namespace commlib {
namespace {

constexpr char kMagic[] = "CLS1";
constexpr size_t kMagicBytes = 4, kTagBytes = 32;

Digest tag_of(const std::string& key, const std::string& name, const void* value, size_t n) {
  std::string msg;
  msg.reserve(4 + name.size() + n);
  const uint32_t be = htonl(static_cast<uint32_t>(name.size()));
  msg.append(reinterpret_cast<const char*>(&be), 4);
  msg += name;
  msg.append(static_cast<const char*>(value), n);
  return hmac_sha256(key, msg.data(), msg.size());
}

// secret.py's name.decode(errors='replace')!r (names are the set-up's keys: UTF-8 text).
std::string name_text(const std::string& name) { return python_str_repr(name); }

}  // namespace

std::string sign_store_value(const std::string& key, const std::string& name, const std::string& value) {
  const Digest tag = tag_of(key, name, value.data(), value.size());
  std::string out(kMagic, kMagicBytes);
  out.append(reinterpret_cast<const char*>(tag.data()), tag.size());
  out += value;
  return out;
}

std::string verify_store_value(const std::string& key, const std::string& name, const std::string& stored) {
  if (stored.size() < kMagicBytes + kTagBytes || stored.compare(0, kMagicBytes, kMagic) != 0)
    throw StoreError(StoreError::Kind::Rendezvous,
                     "store key " + name_text(name) +
                         ": value is not signed (COMMLIB_SECRET is set here; was it set on every rank, and did "
                         "something else write this key?)");
  Digest tag;
  std::memcpy(tag.data(), stored.data() + kMagicBytes, kTagBytes);
  const size_t head = kMagicBytes + kTagBytes;
  if (!digest_equal(tag, tag_of(key, name, stored.data() + head, stored.size() - head)))
    throw StoreError(StoreError::Kind::Rendezvous,
                     "store key " + name_text(name) +
                         ": bad signature (a rank with a different COMMLIB_SECRET, or a forged value)");
  return stored.substr(head);
}

}  // namespace commlib
