// Communicator, Work and the error classes. Every call that may block releases the GIL.
#include <pybind11/stl.h>
#include <unistd.h>

#include <functional>
#include <memory>

#include "bindings/bindings.h"
#include "sim/topology.h"
#include "bindings/buffer_view.h"
#include "bindings/error_kinds.h"
#include "bindings/gil.h"
#include "host/comm_factory.h"
#include "host/communicator.h"
#include "common/errors.h"
#include "schedule/registry.h"
#include "bindings/transport_handles.h"
#include "transport/shm/shm.h"
#include "transport/tcp/tcp_entry.h"

namespace py = pybind11;

namespace commlib {

namespace {
// The communicator's tcp domain (null when no peer is on another host, or once it is closed).
TcpTransport* tcp_of(Communicator& c) {
  return c.has_transport() ? dynamic_cast<TcpTransport*>(c.transport().domain(kTcpKind)) : nullptr;
}
}  // namespace

CollectiveCall collective_call(Collective coll, const std::string& algo, uintptr_t in, uintptr_t out, int64_t count,
                               DType dtype, RedOp op, int root, double scale) {
  return collective_call_on(coll, static_cast<uint8_t>(algorithm_index(coll, algo)), in, out, count, dtype, op, root,
                            scale);
}

std::vector<P2PItem> p2p_items(const std::vector<P2PTuple>& items) {
  std::vector<P2PItem> v;
  v.reserve(items.size());
  for (const auto& [send, ptr, count, peer] : items) v.push_back(P2PItem{send, ptr, count, peer});
  return v;
}

void bind_comm(py::module_& m) {
  bind_error_classes(m);  // the error table (bindings/error_kinds.cc)
  m.def("error_class", [](uint32_t kind) { return py::reinterpret_borrow<py::object>(python_error_class(kind)); },
        py::arg("kind"),
        "The Python class an error kind of the core is raised as (tests: the table core_api hands out).");

  // numpy's .ctypes.data costs ~1 us a call, most of a small collective's Python overhead; the
  // buffer protocol gives the same address in ~0.1 us.
  m.def(
      "buffer_address",
      [](py::handle obj) {
        Py_buffer view;
        if (PyObject_GetBuffer(obj.ptr(), &view, PyBUF_ANY_CONTIGUOUS | PyBUF_WRITABLE) != 0)
          throw py::error_already_set();
        uintptr_t address = reinterpret_cast<uintptr_t>(view.buf);
        PyBuffer_Release(&view);
        return address;
      },
      "Address of a writable contiguous buffer (a NumPy array's data pointer).");

  // The whole description of a NumPy array in one call (address, elements, dtype name), or None
  // when it is not a writable C-contiguous buffer of a supported dtype: the Python side then
  // explains what is wrong. ~0.15 us instead of ~0.5 us of Python attribute look-ups per buffer.
  m.def("describe_buffer", [](py::handle obj) -> py::object {
    BufferView v;
    PyBufferHold hold;
    if (!read_python_buffer(obj.ptr(), &v, &hold)) return py::none();
    return py::make_tuple(v.address, v.count, dtype_name(v.dtype));
  });

  m.def("shm_region_bytes", [](int size) { return shm_region_bytes(size, shm_config_from_env(size)); },
        "Bytes of the shared-memory region a communicator of `size` ranks needs (rank 0 sizes the memfd).");

  py::class_<Work, std::shared_ptr<Work>>(m, "Work")
      .def(
          "wait",
          [](Work& w, double timeout) {
            ReleaseGil nogil;
            return w.wait(timeout);
          },
          py::arg("timeout") = -1.0)
      .def("is_completed", &Work::is_completed);

  py::class_<Communicator>(m, "Communicator")
      .def(py::init([](int rank, int size, int fd, std::vector<int> host_of, std::vector<std::string> host_names,
                       TcpEndpoint* tcp, double timeout, const std::string& label, int debug) {
             std::unique_ptr<TcpTransport> none;
             return make_communicator(CommSpec{rank, size, fd, std::move(host_of), std::move(host_names), timeout,
                                               label, debug},
                                      tcp ? tcp->transport : none);
           }),
           py::arg("rank"), py::arg("size"), py::arg("fd"), py::arg("host_of"), py::arg("host_names"),
           py::arg("tcp"), py::arg("timeout"), py::arg("label") = "", py::arg("debug") = 0)
      .def(py::init(&make_local_communicator), py::arg("rank"), py::arg("size"), py::arg("fd"), py::arg("timeout"),
           py::arg("label") = "", py::arg("debug") = 0)
      .def_property_readonly("host_of", [](const Communicator& c) { return c.topology().host_of; })
      .def_property_readonly("host_names", [](const Communicator& c) { return c.topology().host_names; })
      .def_property_readonly("link_kinds", &Communicator::link_kinds)
      .def(
          "auto_choice",
          [](const Communicator& c, Collective coll, int64_t bytes, int elem_bytes) {
            return c.auto_choice(coll, bytes, elem_bytes);
          },
          py::arg("coll"), py::arg("bytes"), py::arg("elem_bytes") = 1,
          "The algorithm auto picks for `coll` of `bytes` on this communicator's links, as a call of elements of "
          "`elem_bytes` bytes resolves (the element count can decide between candidates the model predicts alike).")
      .def(
          "auto_runs_flag_call",
          [](const Communicator& c, Collective coll, int64_t bytes) { return c.auto_runs_flag_call(coll, bytes); },
          "Whether auto's `coll` of `bytes` runs through the shared-memory flags (small broadcast and barrier with "
          "every rank on one host) rather than auto_choice's schedule.")
      .def(
          "set_cost_model",
          [](Communicator& c, const py::dict& topology) { c.set_cost_model(topology_from_dict(topology)); },
          py::arg("topology"),
          "The simulator topology (link parameters; the placement is this communicator's) auto ranks its "
          "candidates with (COMMLIB_TOPOLOGY). Set before the first call.")
      .def_property_readonly("has_cost_model", &Communicator::has_cost_model)
      .def(
          "connect",
          [](Communicator& c, const std::vector<std::string>& addresses, const py::object& poll) {
            if (!tcp_of(c)) throw std::invalid_argument("connect: this communicator has no TCP links");
            // What poll raised, kept (with its traceback) until the GIL is held again to re-raise it.
            std::unique_ptr<py::error_already_set> raised;
            struct PollRaised {};
            std::function<void()> fn;
            if (!poll.is_none())
              fn = [&] {
                py::gil_scoped_acquire acquire;
                try {
                  poll();
                } catch (py::error_already_set& e) {
                  raised = std::make_unique<py::error_already_set>(std::move(e));
                  throw PollRaised{};
                }
              };
            {
              py::gil_scoped_release release;  // waits for the peers
              try {
                tcp_of(c)->connect(addresses, fn);
              } catch (const PollRaised&) {
              }
            }
            if (raised) throw std::move(*raised);
          },
          py::arg("addresses"), py::arg("poll") = py::none(),
          "Connects the TCP links (every rank's listening address by rank) once every rank listens; "
          "poll() (if given) runs every few tens of milliseconds meanwhile, and what it raises ends the wait.")
      .def("tcp_rejected", [](Communicator& c) { return tcp_of(c) ? tcp_of(c)->rejected() : 0; },
           "Connections the TCP listener refused so far (bad handshakes, garbage).")
      .def("bytes_sent", &Communicator::bytes_sent,
           "Payload bytes this rank has sent to peers in host-executor messages (every transport; "
           "compress=: the encoded bytes), counted as each message completes.")
      .def("single_copy_sends", &Communicator::single_copy_sends,
           "Messages this rank has sent single-copy (its peer read them from this rank's buffer), counted "
           "as each is decided: which form a call's messages took (COMMLIB_CMA, the tuning's crossovers).")
      .def("streamed_calls", &Communicator::streamed_calls,
           "Calls this rank ran with streaming (non-temporal) stores, counted as each decides: which way the "
           "tuning's \"stream\" entries and COMMLIB_STREAM_BYTES sent a call.")
      .def("steps_ahead", &Communicator::steps_ahead,
           "Steps of laned calls (an algorithm of several schedule lanes) that finished while a step listed "
           "before them had not: the overlap the host executor's lanes gave (0 when a call runs in list order).")
      .def("intra_in_flight_max", &Communicator::intra_in_flight_max,
           "The most steps inside the host of a laned call under an intra window (Schedule::intra_window E: "
           "rail_window's shape auto may pick) that ran at once on this rank, over every call so far: at most "
           "E (0 until such a call ran).")
      .def("parked_bytes", &Communicator::parked_bytes,
           "Bytes of laned calls' messages that arrived before their step ran and were copied aside until it "
           "did (the lanes' extra copy; docs/DESIGN.md \"Laned calls\").")
      .def("parked_reads", &Communicator::parked_reads,
           "Single-copy messages of laned calls read when parked (so acknowledgements keep the channel's order).")
      .def(
          "wait_counts",
          [](Communicator& c) {
            const Executor::WaitCounts w = c.wait_counts();
            py::dict d;
            d["passes"] = w.passes;
            d["idle_passes"] = w.idle_passes;
            d["waits"] = w.waits;
            return d;
          },
          "The host executor's wait loops so far, every call (step by step and laned alike): passes over the "
          "running ops, passes that moved nothing, and waits on the doorbell (each spins briefly, then sleeps).")
      .def("tcp_address", [](Communicator& c) { return tcp_of(c) ? tcp_of(c)->address() : std::string(); })
      .def(
          "tcp_stats",
          [](Communicator& c) {
            py::dict d;
            TcpTransport::Stats s = tcp_of(c) ? tcp_of(c)->stats() : TcpTransport::Stats{};
            d["sent_in_place"] = s.sent_in_place;
            d["landed"] = s.landed;
            d["frames_read_by_caller"] = s.frames_read_by_caller;
            d["lanes"] = s.lanes;
            d["frames_striped"] = s.frames_striped;
            d["recv_reads"] = s.recv_reads;
            d["caller_takes"] = s.caller_takes;
            d["reclaims"] = s.reclaims;
            d["spins_out"] = s.spins_out;
            return d;
          },
          "TCP data-path counters (tests): payload bytes sent from callers' buffers, bytes received "
          "straight into destinations, frames read by a waiting caller rather than the progress thread, "
          "connections per peer, data frames sent on connections other than the first, recv calls "
          "that returned data, times a waiting caller took its sockets from the progress thread, "
          "times the progress thread took them back from a caller that had stopped polling, and "
          "a caller's spins that ran out with nothing delivered.")
      .def_property_readonly("rank", &Communicator::rank)
      .def_property_readonly("size", &Communicator::size)
      .def(
          "run",
          [](Communicator& c, Collective coll, const std::string& algo, uintptr_t in, uintptr_t out, int64_t count,
             DType dtype, RedOp op, int root, double scale, bool async) {
            const CollectiveCall call = collective_call(coll, algo, in, out, count, dtype, op, root, scale);
            ReleaseGil nogil;
            return c.collective(call, async);
          },
          py::arg("collective"), py::arg("algorithm"), py::arg("input"), py::arg("output"), py::arg("count"),
          py::arg("dtype"), py::arg("op"), py::arg("root"), py::arg("scale"), py::arg("async_op"))
      .def(
          "p2p",
          [](Communicator& c, const std::vector<P2PTuple>& items, DType dtype, bool async) {
            std::vector<P2PItem> v = p2p_items(items);
            ReleaseGil nogil;
            return c.p2p(std::move(v), dtype, async);
          },
          py::arg("items"), py::arg("dtype"), py::arg("async_op"))
      .def(
          "all_to_allv",
          [](Communicator& c, const std::vector<P2PTuple>& items, DType dtype, int64_t count, bool async) {
            std::vector<P2PItem> v = p2p_items(items);
            ReleaseGil nogil;
            return c.all_to_allv(std::move(v), dtype, count, async);
          },
          py::arg("items"), py::arg("dtype"), py::arg("count"), py::arg("async_op"),
          "An all_to_all with split sizes: the batch p2p runs (items as p2p takes them), numbered as a collective, "
          "so its errors name all_to_all #n; count: the elements this rank sends.")
      .def(
          "recv_any",
          [](Communicator& c, uintptr_t ptr, int64_t count, DType dtype, uintptr_t source, bool async) {
            ReleaseGil nogil;
            return c.recv_any(ptr, count, dtype, reinterpret_cast<int32_t*>(source), async);
          },
          py::arg("ptr"), py::arg("count"), py::arg("dtype"), py::arg("source"), py::arg("async_op"),
          "Receive count elements at ptr from whichever rank sends first; its rank goes to the int32 at source.")
      .def(
          "peer_states",
          [](Communicator& c) {
            // Polled while survivors agree on a shrink (commlib/shrink.py): how this rank sees
            // each peer now, checking the processes of ranks on this host.
            if (!c.has_transport()) throw CommError("peer_states: the communicator is closed");
            py::list out;
            for (int p = 0; p < c.size(); ++p) {
              if (p == c.rank()) {
                out.append(py::make_tuple("self", static_cast<int>(getpid()), ""));
                continue;
              }
              PeerStatus st = c.transport().peer_status(p, true);
              static const char* names[] = {"unknown", "alive", "closed", "failed", "dead"};
              const auto i = static_cast<uint32_t>(st.state);
              out.append(py::make_tuple(i < 5 ? names[i] : "unknown", c.transport().peer_pid(p), st.message));
            }
            return out;
          },
          "(state, pid, message) of every rank as this rank sees it now: self, unknown, alive, "
          "closed, failed (published an error) or dead (process gone or connection lost).")
      .def("enable_direct_reads", &Communicator::enable_direct_reads)
      .def("direct_reads_reason", &Communicator::direct_reads_reason,
           "Why single-copy reads are off on this rank ('' when on): COMMLIB_CMA=0, or the probe's failure "
           "(process_vm_readv refused: ptrace scope, another user, a seccomp filter).")
      .def("close",
           [](Communicator& c) {
             ReleaseGil nogil;
             c.close();
           })
      .def("abort", &Communicator::abort)
      .def("aborted", &Communicator::aborted);
}

}  // namespace commlib
