// The store the stream engine's set-up meets the other ranks through (device_engine_setup.h): the
// communicator's store, whatever it is. A header of its own, with nothing of the core in it, so
// another extension module (commlib._C_torch: torch's c10d::Store) can implement it and hand it
// over through bindings/device_setup_api.h.
#pragma once

#include <string>

namespace commlib {

// Keys and values are bytes; try_get never waits. Errors the store raises (a connection lost, a
// signature refused) propagate as they are.
class SetupStore {
 public:
  virtual ~SetupStore() = default;
  virtual void set(const std::string& key, const std::string& value) = 0;
  virtual bool try_get(const std::string& key, std::string* value) = 0;
  // A set-up is over (DeviceEngines::set_up, on every exit): let go of what only a set-up needs.
  // commlib's own store closes its connection (bindings/commlib_setup_store.h), so that an idle
  // one holds no server open (bootstrap/store_lease.py waits for its clients to go).
  virtual void idle() {}
};

}  // namespace commlib
