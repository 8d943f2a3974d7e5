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
};

}  // namespace commlib
