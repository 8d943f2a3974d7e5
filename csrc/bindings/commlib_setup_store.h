// The stream engine's set-up over commlib's own store from C++ (issue #44): where the communicator's
// store is commlib's TCPStore, or a SignedStore over one (COMMLIB_SECRET), its address, timeout,
// messages and signing key are read once, under the GIL, when the device route is made; every
// operation of every set-up then goes through the C++ client (bootstrap/store_client.h, with
// bootstrap/signed_values.h's signatures) without the GIL: a store server on a thread of this very
// process is never waited for under it. torch's store (and a SignedStore over it) is spoken from C++
// once commlib._C_torch hands its c10d::Store over (device_engines.h set_store). Any other store (a
// user's object) keeps its Python object's set/check/get (device_engine_setup_bindings.cc
// PythonSetupStore).
#pragma once

#include <pybind11/pybind11.h>

#include <memory>
#include <string>

#include "bindings/setup_store.h"

namespace commlib {

// commlib's store behind `store` as a SetupStore, or null where `store` is not commlib's own
// (exactly commlib.bootstrap.store.TCPStore, or commlib.bootstrap.secret.SignedStore over one: a
// subclass may override what it does, so it keeps its Python object). Under the GIL.
std::unique_ptr<SetupStore> commlib_setup_store(pybind11::handle store);

// The signing key of `store` where it is exactly commlib.bootstrap.secret.SignedStore (whatever its
// inner store), else empty. Under the GIL.
std::string store_signing_key(pybind11::handle store);

// `inner` with SignedStore's set and get: every value set signed for its key, every value read
// verified (bootstrap/signed_values.h: a tampered, replayed, unsigned or foreign-secret value is
// SignedStore's RendezvousError). Pure C++: over a store spoken from C++ (commlib's client, torch's
// c10d::Store) no operation takes the GIL.
std::shared_ptr<SetupStore> signed_setup_store(std::shared_ptr<SetupStore> inner, std::string key);

// _C.CommlibSetupStore (a test seam: the set-up's store operations one at a time),
// _C.sign_store_value / verify_store_value, and StoreError raised as commlib.errors' class.
void bind_commlib_setup_store(pybind11::module_& m);

}  // namespace commlib
