// Bootstrap-side objects: the TCP endpoint (listens at once so its address can be published
// through the store before any rank connects), the transport table's choice and HMAC-SHA256 for tests.
#include <pybind11/stl.h>

#include "bindings/bindings.h"
#include "bindings/transport_handles.h"
#include "host/lane_hold.h"
#include "host/read_gate.h"
#include "transport/tcp/hmac_sha256.h"
#include "transport/registry.h"
#include "transport/shm/shm_entry.h"
#include "transport/tcp/tcp_entry.h"
#include "transport/toy/toy.h"

namespace py = pybind11;

namespace commlib {

void bind_transport(py::module_& m) {
  py::class_<TcpEndpoint>(m, "TcpEndpoint",
                          "A rank's TCP listener, before its communicator exists (see commlib.bootstrap).")
      .def(py::init([](int rank, int size, const std::string& comm_id, std::vector<bool> remote, double timeout,
                       int debug) {
             if (rank < 0 || rank >= size) throw std::invalid_argument("rank: out of range for world_size");
             auto* e = new TcpEndpoint;
             e->transport = std::make_unique<TcpTransport>(rank, size, comm_id, std::move(remote),
                                                           tcp_config_from_env(timeout, debug));
             return e;
           }),
           py::arg("rank"), py::arg("size"), py::arg("comm_id"), py::arg("remote"), py::arg("timeout"),
           py::arg("debug") = 0)
      .def_property_readonly("address", [](const TcpEndpoint& e) {
        if (!e.transport) throw std::invalid_argument("endpoint: already handed to a communicator");
        return e.transport->address();
      })
      .def(
          "connect",
          [](TcpEndpoint& e, const std::vector<std::string>& addresses) {
            if (!e.transport) throw std::invalid_argument("endpoint: already handed to a communicator");
            py::gil_scoped_release release;
            e.transport->connect(addresses);
          },
          "Connect to every remote rank (tests; a communicator connects its own endpoint).")
      .def_property_readonly("rejected", [](const TcpEndpoint& e) { return e.transport ? e.transport->rejected() : 0; })
      .def_property_readonly("authenticated", [](const TcpEndpoint& e) { return e.transport && e.transport->authenticated(); });

  m.def(
      "transport_choice",
      [](int rank, std::vector<int> host_of, bool host_region, std::vector<bool> net) {
        FabricInputs in;
        in.rank = rank;
        in.topo.host_of = std::move(host_of);
        if (host_region) in.material[kShmKind] = std::make_unique<ShmRegion>(-1);
        if (!net.empty()) {
          auto m = std::make_unique<TcpEndpointMaterial>(nullptr);
          m->reaches = std::move(net);
          in.material[kTcpKind] = std::move(m);
        }
        std::vector<std::string> names;
        for (const TransportEntry* e : choose_transports(in)) names.push_back(e ? e->name : "self");
        return names;
      },
      py::arg("rank"), py::arg("host_of"), py::arg("host_region"), py::arg("net"),
      "The transport table's choice per peer (tests): `net[r]` says whether a TCP endpoint reaches rank r.");
  m.def("transport_table", [] {
    std::vector<std::string> names;
    for (const TransportEntry* e : transport_table()) names.push_back(e->name);
    return names;
  }, "The transport table's entries, in order of preference.");

  m.def("toy_transport", &toy::set_registered, py::arg("on"),
        "Registers the toy kind of transport ahead of shm, or withdraws it (tests: transport/toy/toy.h).");
  m.def("toy_transport_stutter", &toy::set_stutter, py::arg("on"),
        "Every other send slot (received chunk) of a toy link is not there yet (tests: transport/toy/toy.h).");
  m.def("toy_transport_chunks", &toy::chunks_published, "Chunks this process's toy links published (tests).");
  m.def("hold_next_single_copy_read", &arm_read_gate, py::arg("peer"), py::arg("path"), py::arg("max_wait_s") = 60.0,
        "Tests (host/read_gate.h): this process's next single-copy read of rank `peer` creates the file `path` once "
        "the peer published its buffer, and reads only once that file is removed (or after `max_wait_s` s); "
        "path '' disarms.");
  m.def("hold_lane_sends", &arm_lane_hold, py::arg("lane"), py::arg("path"), py::arg("max_wait_s") = 60.0,
        "Tests (host/lane_hold.h): this process's sends of schedule lane `lane` in laned calls wait while the file "
        "`path` exists (at most `max_wait_s` s from the first held send), the other lanes going on; path '' disarms.");
  m.def("laned_park_eagerly", &set_park_eagerly, py::arg("on"),
        "Tests (host/lane_hold.h): laned calls in this process park every chunk that comes before its step runs "
        "at once (by default only when a receive of that peer may be behind it or nothing else moved).");

  m.def(
      "hmac_sha256",
      [](py::bytes key, py::bytes msg) {
        std::string k = key, s = msg;
        Digest d = hmac_sha256(k, s.data(), s.size());
        return py::bytes(reinterpret_cast<const char*>(d.data()), d.size());
      },
      "HMAC-SHA256 as the TCP handshake computes it (tests compare it with Python's hmac).");
}

}  // namespace commlib
