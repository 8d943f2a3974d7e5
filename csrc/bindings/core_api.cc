// `_C.core_api()`: the table of bindings/core_api.h over the host communicator.
#include "bindings/core_api.h"

#include <exception>
#include <stdexcept>

#include "bindings/bindings.h"
#include "bindings/error_kinds.h"
#include "bindings/fast_call.h"
#include "host/communicator.h"
#include "stream/device_work.h"
#include "stream/stream_engine.h"
#include "schedule/registry.h"

namespace py = pybind11;

namespace commlib {
namespace {

// Runs `body`; false with the error recorded in *err when it threw. Every call of the table goes
// through it: the table never throws (core_api.h), and each error is classified once, alike.
template <typename Body>
bool recorded(CoreError* err, Body&& body) {
  try {
    body();
    return true;
  } catch (...) {
    *err = classify_error(std::current_exception());
    return false;
  }
}

Communicator& comm_at(void* c) { return *static_cast<Communicator*>(c); }

bool api_collective(void* c, const CollectiveCall& call, bool async, double timeout_s, std::shared_ptr<Work>* work,
                    CoreError* err) {
  return recorded(err, [&] {
    auto w = comm_at(c).collective(call, async, timeout_s);
    if (work) *work = std::move(w);
  });
}

bool api_p2p(void* c, const P2PItem* items, size_t n, DType dtype, bool async, double timeout_s,
             std::shared_ptr<Work>* work, CoreError* err) {
  return recorded(err, [&] {
    auto w = comm_at(c).p2p(std::vector<P2PItem>(items, items + n), dtype, async, timeout_s);
    if (work) *work = std::move(w);
  });
}

bool api_recv_any(void* c, uintptr_t ptr, int64_t count, DType dtype, int32_t* source, bool async, double timeout_s,
                  std::shared_ptr<Work>* work, CoreError* err) {
  return recorded(err, [&] {
    auto w = comm_at(c).recv_any(ptr, count, dtype, source, async, timeout_s);
    if (work) *work = std::move(w);
  });
}

bool api_wait(const std::shared_ptr<Work>& work, double timeout_s, bool* done, CoreError* err) {
  *done = true;  // (a failed call is done)
  return recorded(err, [&] { *done = work ? work->wait(timeout_s) : true; });
}

bool api_is_completed(const std::shared_ptr<Work>& work) { return !work || work->is_completed(); }

int api_algorithm_index(Collective c, const char* name) {
  try {
    return algorithm_index(c, name);
  } catch (...) {
    return -1;
  }
}

int api_rank(void* c) { return comm_at(c).rank(); }
int api_size(void* c) { return comm_at(c).size(); }
void api_abort(void* c, const char* reason) {
  try {
    comm_at(c).abort(reason);
  } catch (...) {  // aborting is best effort
  }
}

// 1 ran, 0 not held by the cache (nothing ran), -1 error: device_collective's and device_p2p's answer.
template <typename Run>
int ran_or_recorded(CoreError* err, Run&& run) {
  bool ran = false;
  return recorded(err, [&] { ran = run(); }) ? (ran ? 1 : 0) : -1;
}

int api_device_collective(void* cache, const CollectiveCall& call, uint8_t kind_in, uint8_t kind_out, int device,
                          uintptr_t stream, std::shared_ptr<DeviceWork>* work, CoreError* err) {
  return ran_or_recorded(err, [&] {
    return run_device_call_native(*static_cast<DeviceCallCache*>(cache), call, static_cast<BufferKind>(kind_in),
                                  static_cast<BufferKind>(kind_out), device, stream, work);
  });
}

bool api_device_known_complete(const std::shared_ptr<DeviceWork>& work) { return !work || work->known_complete(); }

bool api_device_is_completed(const std::shared_ptr<DeviceWork>& work, bool* done, CoreError* err) {
  *done = true;  // (a failed call is done)
  return recorded(err, [&] {
    *done = !work || work->is_completed();
    if (*done && work) work->synchronize();  // done: returns at once, raising the call's error if it failed
  });
}

bool api_device_synchronize(const std::shared_ptr<DeviceWork>& work, CoreError* err) {
  return recorded(err, [&] {
    if (work) work->synchronize();
  });
}

int api_device_p2p(void* cache, const P2PItem* items, size_t n, DType dtype, uint8_t kind, int device, uintptr_t stream,
                   std::shared_ptr<DeviceWork>* work, CoreError* err) {
  return ran_or_recorded(err, [&] {
    return run_device_p2p_native(*static_cast<DeviceCallCache*>(cache), items, n, dtype, static_cast<BufferKind>(kind),
                                 device, stream, work);
  });
}

bool api_all_to_allv(void* c, const P2PItem* items, size_t n, DType dtype, int64_t count, bool async,
                     double timeout_s, std::shared_ptr<Work>* work, CoreError* err) {
  return recorded(err, [&] {
    auto w = comm_at(c).all_to_allv(std::vector<P2PItem>(items, items + n), dtype, count, async, timeout_s);
    if (work) *work = std::move(w);
  });
}

int api_device_all_to_allv(void* cache, const P2PItem* items, size_t n, DType dtype, int64_t count, uint8_t kind,
                           int device, uintptr_t stream, std::shared_ptr<DeviceWork>* work, CoreError* err) {
  return ran_or_recorded(err, [&] {
    return run_device_p2p_native(*static_cast<DeviceCallCache*>(cache), items, n, dtype, static_cast<BufferKind>(kind),
                                 device, stream, work, count);
  });
}

bool api_device_work_of(PyObject* obj, std::shared_ptr<DeviceWork>* work) {
  try {
    py::handle inner = py::handle(obj).attr("_work");  // device_route.DeviceWork's engine work
    *work = inner.cast<std::shared_ptr<DeviceWork>>();
    return true;
  } catch (py::error_already_set& e) {
    e.restore();
    PyErr_Clear();
    return false;
  } catch (...) {
    return false;
  }
}

void api_device_ticket(const std::shared_ptr<DeviceWork>& work, DeviceTicket* ticket) {
  if (!work || work->captured()) {
    *ticket = DeviceTicket{};
    return;
  }
  *ticket = DeviceTicket{work->engine(), work->seq()};
}

bool api_device_ticket_retired(const DeviceTicket& t) {
  return t.seq == 0 || static_cast<const StreamEngine*>(t.engine.get())->retired(t.seq);
}

const CoreApi g_api = {kCoreApiVersion,      api_collective,           api_p2p,
                       api_recv_any,         api_wait,                 api_is_completed,
                       api_algorithm_index,  api_rank,                 api_size,
                       api_abort,            python_error_class,       api_device_collective,
                       api_device_known_complete, api_device_is_completed, api_device_synchronize,
                       api_device_p2p,       api_device_work_of,       api_device_ticket,
                       api_device_ticket_retired, api_all_to_allv,     api_device_all_to_allv};

}  // namespace

void bind_core_api(py::module_& m) {
  m.def(
      "core_api", [] { return py::capsule(static_cast<const void*>(&g_api), kCoreApiCapsule); },
      "The core's C++ entry for other extension modules (a PyCapsule of bindings/core_api.h's table).");
}

}  // namespace commlib
