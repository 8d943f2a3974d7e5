// Signed store values (COMMLIB_SECRET), in C++: commlib/bootstrap/secret.py's format, byte for byte,
// with the TCP transport's HMAC-SHA256 (transport/tcp/hmac_sha256.h). A signed value is
// "CLS1" + tag + value, tag = HMAC-SHA256(store key, u32_be(len(name)) + name + value): the key name
// is bound in, so a value cannot be replayed under another key. The store key is the 32 bytes
// secret.py derives (derive_key(secret, "store")), read from the Python SignedStore once.
#pragma once

#include <string>

namespace commlib {

std::string sign_store_value(const std::string& key, const std::string& name, const std::string& value);

// The value inside `stored` if it is signed with `key` for `name`; else StoreError (RendezvousError)
// with secret.py verify_value's text: "value is not signed" or "bad signature".
std::string verify_store_value(const std::string& key, const std::string& name, const std::string& stored);

}  // namespace commlib
