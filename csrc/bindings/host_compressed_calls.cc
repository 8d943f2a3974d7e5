// Host collectives with compress= through the C++ entry (bindings/fast_call.cc; issue #37 item 2):
// a call on host buffers, blocking or async, whose codec the Python path resolved before
// (core/codecs.py compressed_call: the codec checked, auto resolved to an algorithm the verifier
// proves keeps every rank identical) runs with no Python in between, as the device entry's
// compress= calls do (device_call_cache.h).
//
// Why a cache: what compressed_call decides is a function of the collective, the requested
// algorithm, the compress= object, the count and the dtype on one communicator (its size and host
// map); the verifier's proof is the costly part and the whole reason Python owns it. The Python
// path adds a call here only after it passed every check and ran (Communicator._run:
// _C.add_host_compressed), keyed on the compress= object as given (held, so its identity stays
// its own) and the requested algorithm's code; a later call of that key takes the codec and the
// algorithm the Python path resolved, with its buffers, op and scale read by call_of as any host
// call's; the entry runs it (fast_call.cc: blocking, or async on the communicator's worker with
// the Python path's Work handle). A communicator's entries die with it: a close listener marks
// them gone (it runs at close or destruction, on any thread, so it only flips a flag), and a lookup
// drops a gone entry (a new communicator at the same address misses). A new algorithm registry
// drops them all.
#include "bindings/fast_call.h"

#include <pybind11/pybind11.h>

#include <atomic>
#include <exception>
#include <functional>
#include <memory>
#include <string>
#include <unordered_map>

#include "bindings/bindings.h"
#include "bindings/call_names.h"
#include "bindings/gil.h"
#include "host/communicator.h"
#include "schedule/registry.h"

namespace py = pybind11;

namespace commlib {

namespace {

struct Key {
  const Communicator* comm = nullptr;
  Collective coll = Collective::AllReduce;
  int algo = 0;                // the requested algorithm's code (auto: 0)
  PyObject* compress = nullptr;  // the compress= object as given (held by the entry)
  int64_t count = 0;
  DType dtype = DType::UInt8;
  bool operator==(const Key& o) const {
    return comm == o.comm && coll == o.coll && algo == o.algo && compress == o.compress && count == o.count &&
           dtype == o.dtype;
  }
};

struct KeyHash {
  size_t operator()(const Key& k) const {
    size_t h = std::hash<const void*>()(k.comm) ^ (std::hash<const void*>()(k.compress) << 1);
    h ^= std::hash<int64_t>()(k.count) * 31 + static_cast<size_t>(k.coll) * 7 + static_cast<size_t>(k.algo) * 131 +
         static_cast<size_t>(k.dtype);
    return h;
  }
};

struct Entry {
  py::object compress;  // held: the key's identity
  uint8_t algo = 0;     // the algorithm compressed_call resolved
  CodecSpec codec;      // and the codec (with the communicator's piece size)
  std::shared_ptr<std::atomic<bool>> gone;  // the communicator closed (its close listener)
};

// Under the GIL (every reader and writer holds it). Made once and never destroyed: the entries hold
// Python objects, which must not be released by a static destructor after the interpreter ended.
std::unordered_map<Key, Entry, KeyHash>& g_entries = *new std::unordered_map<Key, Entry, KeyHash>();
// The communicators with a close listener here, and the flag it sets.
std::unordered_map<const Communicator*, std::shared_ptr<std::atomic<bool>>>& g_listening =
    *new std::unordered_map<const Communicator*, std::shared_ptr<std::atomic<bool>>>();
uint64_t g_registry = 0;
uint64_t g_hits = 0;
constexpr size_t kMaxEntries = 256;

void drop_gone() {
  for (auto it = g_listening.begin(); it != g_listening.end();) {
    if (it->second->load(std::memory_order_acquire)) {
      for (auto e = g_entries.begin(); e != g_entries.end();)
        e = e->first.comm == it->first ? g_entries.erase(e) : std::next(e);
      it = g_listening.erase(it);
    } else {
      ++it;
    }
  }
}

void add(uintptr_t comm_address, int coll_code, py::handle algorithm, py::handle compress, int64_t count,
         DType dtype, const std::string& codec, int64_t block, const std::string& rounding, uint64_t seed,
         bool inter_only, const std::string& resolved) {
  auto* comm = reinterpret_cast<Communicator*>(comm_address);
  if (comm == nullptr || coll_code < 0 || coll_code >= static_cast<int>(Collective::kCount) || compress.is_none())
    return;
  const Collective coll = static_cast<Collective>(coll_code);
  const int algo = parse_algorithm_name(coll, algorithm.ptr());
  if (algo < 0) return;  // (a name the host path's table does not read: never looked up either)
  const CollectiveCall call = compressed_collective_call(coll, resolved, 0, 0, count, dtype, RedOp::Sum, 0, 1.0, codec,
                                                         block, rounding, seed, inter_only);
  drop_gone();
  if (g_registry != registry_generation() || g_entries.size() >= kMaxEntries) g_entries.clear();
  g_registry = registry_generation();
  std::shared_ptr<std::atomic<bool>>& gone = g_listening[comm];
  if (!gone) {
    gone = std::make_shared<std::atomic<bool>>(false);
    std::weak_ptr<std::atomic<bool>> flag = gone;
    comm->add_close_listener([flag] {
      if (auto f = flag.lock()) f->store(true, std::memory_order_release);
    });
  }
  Entry e{py::reinterpret_borrow<py::object>(compress), call.algo, call.codec, gone};
  e.codec.piece_bytes = comm->codec_piece_bytes();
  g_entries[Key{comm, coll, algo, compress.ptr(), count, dtype}] = std::move(e);
}

}  // namespace

bool host_compressed_call(Communicator& comm, Collective coll, PyObject* const* args, const BufferView& va,
                          const BufferView& vb, PyObject* compress, CollectiveCall* out) {
  if (g_entries.empty()) return false;
  CollectiveCall call;
  if (!call_of(coll, comm.size(), comm.rank(), args[4], args[5], args[6], args[8], va, vb, &call)) return false;
  const auto it = g_entries.find(Key{&comm, coll, call.algo, compress, call.count, call.dtype});
  if (it == g_entries.end()) return false;
  if (it->second.gone->load(std::memory_order_acquire) || g_registry != registry_generation()) {
    drop_gone();  // (the communicator closed: the Python path says so; a new registry: it resolves again)
    if (g_registry != registry_generation()) g_entries.clear();
    return false;
  }
  call.algo = it->second.algo;
  call.codec = it->second.codec;
  *out = call;
  ++g_hits;
  return true;
}

void bind_host_compressed(py::module_& m) {
  m.def("add_host_compressed", &add, py::arg("core_address"), py::arg("collective"), py::arg("algorithm"),
        py::arg("compress"), py::arg("count"), py::arg("dtype"), py::arg("codec"), py::arg("block"),
        py::arg("rounding"), py::arg("seed"), py::arg("inter_only"), py::arg("resolved"),
        "After a host collective with compress= passed the Python path's checks and ran: later calls (blocking or "
        "async) of the same collective, requested algorithm, compress= object, count and dtype on this "
        "communicator run from the C++ entry with the codec and algorithm resolved (bindings/host_compressed_calls.cc).");
  m.def(
      "host_compressed_counts", [] { return std::make_pair(g_hits, g_entries.size()); },
      "(host calls with compress= the C++ entry took, blocking and async, entries held) in this process, for "
      "tests.");
}

}  // namespace commlib
