// commlib's own store for the set-up, from C++ (commlib_setup_store.h).
#include "bindings/commlib_setup_store.h"

#include <pybind11/stl.h>

#include <mutex>
#include <optional>

#include "bootstrap/signed_values.h"
#include "bootstrap/store_client.h"
#include "bootstrap/store_error.h"

namespace py = pybind11;

namespace commlib {
namespace {

// The set-up's store: set and check-and-read over the client (signed by signed_setup_store where
// the Python store was a SignedStore).
class CommlibSetupStore : public SetupStore {
 public:
  explicit CommlibSetupStore(StoreAddress address) : client_(std::move(address)) {}
  void set(const std::string& key, const std::string& value) override {
    std::lock_guard<std::mutex> lock(mu_);
    client_.set(key, value);
  }
  bool try_get(const std::string& key, std::string* value) override {
    std::lock_guard<std::mutex> lock(mu_);
    return client_.try_get(key, value);
  }
  void idle() override {
    std::lock_guard<std::mutex> lock(mu_);
    client_.close();
  }

 private:
  std::mutex mu_;
  StoreClient client_;
};

// SignedStore.set / get over any set-up store (signed_setup_store).
class SignedSetupStore : public SetupStore {
 public:
  SignedSetupStore(std::shared_ptr<SetupStore> inner, std::string key) : inner_(std::move(inner)), key_(std::move(key)) {}
  void set(const std::string& key, const std::string& value) override {
    inner_->set(key, sign_store_value(key_, key, value));
  }
  bool try_get(const std::string& key, std::string* value) override {
    std::string stored;
    if (!inner_->try_get(key, &stored)) return false;
    *value = verify_store_value(key_, key, stored);
    return true;
  }
  void idle() override { inner_->idle(); }

 private:
  const std::shared_ptr<SetupStore> inner_;
  const std::string key_;
};

py::object store_module_attr(const char* module, const char* name) {
  return py::module_::import(module).attr(name);
}

}  // namespace

std::string store_signing_key(py::handle store) {
  py::object signed_type = store_module_attr("commlib.bootstrap.secret", "SignedStore");
  if (!py::type::handle_of(store).is(signed_type)) return std::string();
  return py::bytes(store.attr("_key")).cast<std::string>();
}

std::shared_ptr<SetupStore> signed_setup_store(std::shared_ptr<SetupStore> inner, std::string key) {
  return std::make_shared<SignedSetupStore>(std::move(inner), std::move(key));
}

std::unique_ptr<SetupStore> commlib_setup_store(py::handle store) {
  py::object tcp_type = store_module_attr("commlib.bootstrap.store", "TCPStore");
  std::string key = store_signing_key(store);
  py::handle tcp = key.empty() ? store : store.attr("inner");
  if (!py::type::handle_of(tcp).is(tcp_type)) return nullptr;
  // The server this store's socket reached (numeric), and what its messages call it. A store whose
  // socket is closed already keeps its Python object: its own operations say what is wrong.
  py::tuple peer;
  try {
    peer = tcp.attr("_sock").attr("getpeername")();
  } catch (const py::error_already_set& e) {
    if (!e.matches(PyExc_OSError)) throw;
    return nullptr;
  }
  StoreAddress a;
  a.host = peer[0].cast<std::string>();
  a.port = peer[1].cast<int>();
  a.where = tcp.attr("_where").cast<std::string>();
  a.timeout_s = tcp.attr("timeout").cast<double>();
  const bool rank0 = tcp.attr("served_by_rank0").cast<bool>();
  // store.py's texts for a lost connection and a silent server (TCPStore._exchange).
  a.lost_advice = rank0 ? store_module_attr("commlib.bootstrap.store", "RANK0_STORE_LOST").cast<std::string>()
                        : "the server closed it (it stopped, or is not a commlib store)";
  if (rank0)
    a.silent_advice = "; it is served in rank 0's process: if rank 0 (or its host) died, the store died with it. " +
                      store_module_attr("commlib.bootstrap.store", "RANK0_STORE_ADVICE").cast<std::string>();
  auto client = std::make_unique<CommlibSetupStore>(std::move(a));
  if (key.empty()) return client;
  return std::make_unique<SignedSetupStore>(std::move(client), std::move(key));
}

void bind_commlib_setup_store(py::module_& m) {
  // A StoreError reaches Python as commlib.errors' own class (RendezvousError, StoreLostError), as
  // the Python store raised it.
  py::register_exception_translator([](std::exception_ptr p) {
    if (!p) return;
    try {
      std::rethrow_exception(p);
    } catch (const StoreError& e) {
      py::object cls = store_module_attr("commlib.errors", e.python_class());
      PyErr_SetString(cls.ptr(), e.message().c_str());
    }
  });
  m.def(
      "sign_store_value",
      [](py::bytes key, py::bytes name, py::bytes value) {
        return py::bytes(sign_store_value(key.cast<std::string>(), name.cast<std::string>(), value.cast<std::string>()));
      },
      py::arg("key"), py::arg("name"), py::arg("value"),
      "A store value signed as commlib.bootstrap.secret.sign_value signs it (bootstrap/signed_values.h).");
  m.def(
      "verify_store_value",
      [](py::bytes key, py::bytes name, py::bytes stored) {
        return py::bytes(
            verify_store_value(key.cast<std::string>(), name.cast<std::string>(), stored.cast<std::string>()));
      },
      py::arg("key"), py::arg("name"), py::arg("stored"),
      "The value inside a signed one, as secret.verify_value returns it; RendezvousError as it raises.");
  py::class_<SetupStore, std::shared_ptr<SetupStore>>(m, "CommlibSetupStore",
                                                      "The device engine set-up's store operations over commlib's "
                                                      "own store from C++ (a test seam: bindings/commlib_setup_store.h).")
      .def_static(
          "of",
          [](py::object store) -> std::optional<std::shared_ptr<SetupStore>> {
            std::unique_ptr<SetupStore> s = commlib_setup_store(store);
            if (!s) return std::nullopt;
            return std::shared_ptr<SetupStore>(std::move(s));
          },
          py::arg("store"), "The set-up's C++ store over `store`, or None where it is not commlib's own.")
      .def(
          "set",
          [](SetupStore& s, const std::string& key, py::bytes value) {
            const std::string v = value;
            py::gil_scoped_release nogil;
            s.set(key, v);
          },
          py::arg("key"), py::arg("value"))
      .def(
          "try_get",
          [](SetupStore& s, const std::string& key) -> py::object {
            std::string value;
            bool found;
            {
              py::gil_scoped_release nogil;
              found = s.try_get(key, &value);
            }
            return found ? py::object(py::bytes(value)) : py::object(py::none());
          },
          py::arg("key"), "The value under `key` (verified where signed), or None; never waits.")
      .def("idle", &SetupStore::idle, "Close the connection (the next operation opens one).");
}

}  // namespace commlib
