// The errors commlib's store client raises (store_client.h, signed_values.h), by the Python class
// commlib's Python store raises for the same event (commlib/errors.py): RendezvousError (no answer,
// a malformed answer, a refused write, a bad signature) or StoreLostError (the server closed or reset
// the connection). Not a CommError in C++: the bindings raise the Python class itself
// (bindings/commlib_setup_store.cc), and what() is "Class: message", the text a Python error seen
// from C++ has (pybind11's error_already_set), so a set-up's report under its error key
// (device_engine_setup.cc setup_failure_report) reads as before.
#pragma once

#include <stdexcept>
#include <string>

namespace commlib {

class StoreError : public std::runtime_error {
 public:
  enum class Kind { Rendezvous, Lost };
  StoreError(Kind kind, const std::string& message)
      : std::runtime_error(std::string(kind == Kind::Lost ? "StoreLostError" : "RendezvousError") + ": " + message),
        kind_(kind),
        message_(message) {}
  Kind kind() const { return kind_; }
  // commlib.errors' class name, and the message alone (what() has both).
  const char* python_class() const { return kind_ == Kind::Lost ? "StoreLostError" : "RendezvousError"; }
  const std::string& message() const { return message_; }

 private:
  Kind kind_;
  std::string message_;
};

// Python's repr() of a str (the keys the Python store names in its messages, f"{key!r}"): quotes
// chosen as Python chooses them, backslash escapes for \\, the quote, \t \n \r and other control
// bytes; bytes from 0x80 up are taken as UTF-8 and kept (Python keeps printable non-ASCII).
std::string python_str_repr(const std::string& s);

// Python's f"{x:g}" of a float (6 significant digits), as its messages print seconds.
std::string python_g(double x);

}  // namespace commlib
