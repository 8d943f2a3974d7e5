// The device interface, the emulated device and the stream engine, for commlib.emulated and
// commlib.device_engine. Every call that may block releases the GIL (ReleaseGil: safe at
// interpreter exit, bindings/gil.h).
#include <pybind11/stl.h>  // (std::optional too)

#include <cstring>

#include "common/alloc_count.h"
#include "bindings/bindings.h"
#include "bindings/gil.h"
#include "bindings/peer_control.h"
#include "device/emulated/emulated_device.h"
#include "device/emulated/emulated_kernel_counters.h"
#include "device/emulated/emulated_rules.h"
#include "device/emulated/query_gate.h"
#include "device/nccl_loader.h"
#include "host/communicator.h"
#include "stream/stream_engine.h"
#include "schedule/registry.h"

namespace py = pybind11;

namespace commlib {
namespace {

// collective_call, plus algorithm="nccl" (NCCL's own collective: stream/nccl_link.h), which only
// device calls have. Collective, dtype and op come as the call spec's enums (commlib/core/call_spec.py):
// nothing is parsed back here but the algorithm's name.
CollectiveCall device_call(Collective coll, const std::string& algo, uintptr_t in, uintptr_t out, int64_t count,
                           DType dtype, RedOp op, int root, double scale) {
  const bool nccl = algo == "nccl";
  CollectiveCall call = collective_call(coll, nccl ? "auto" : algo, in, out, count, dtype, op, root, scale);
  if (nccl) call.algo = kNcclAlgorithmCode;
  return call;
}

CaptureMode capture_mode(const std::string& mode) {
  for (CaptureMode m : {CaptureMode::Global, CaptureMode::ThreadLocal, CaptureMode::Relaxed})
    if (mode == capture_mode_name(m)) return m;
  throw std::invalid_argument("mode: expected 'global', 'thread_local' or 'relaxed', got '" + mode + "'");
}

const char* capture_status_name(CaptureStatus s) {
  return s == CaptureStatus::Active ? "active" : s == CaptureStatus::Invalidated ? "invalidated" : "none";
}

// Stream capture and graphs (device/device.h), for commlib.emulated's graph() and the tests.
void bind_capture(py::class_<Device, std::shared_ptr<Device>>& d) {
  d.def("begin_capture",
        [](Device& d, DeviceStream& s, const std::string& mode) {
          const CaptureMode m = capture_mode(mode);
          DeviceGuard g(d);
          d.begin_capture(s, m);
        },
        py::arg("stream"), py::arg("mode") = "global")
      .def("end_capture",
           [](Device& d, DeviceStream& s) {
             DeviceGuard g(d);
             return d.end_capture(s);
           })
      .def("capture_status",
           [](Device& d, DeviceStream& s) {
             DeviceGuard g(d);
             uint64_t id = 0;
             const CaptureStatus st = d.capture_status(s, &id);
             return py::make_tuple(capture_status_name(st), id);
           },
           "cudaStreamGetCaptureInfo: ('none' | 'active' | 'invalidated', the capture's id or 0).")
      .def("exchange_capture_mode",
           [](Device& d, const std::string& mode) { return capture_mode_name(d.exchange_capture_mode(capture_mode(mode))); },
           py::arg("mode"), "cudaThreadExchangeStreamCaptureMode: sets this thread's mode, returns the previous one.")
      .def("instantiate",
           [](Device& d, DeviceGraph& graph) {
             DeviceGuard g(d);
             return d.instantiate(graph);
           })
      .def("launch_graph", [](Device& d, DeviceGraphExec& exec, DeviceStream& s) {
        DeviceGuard g(d);
        d.launch_graph(exec, s);
      });
}

}  // namespace

void bind_device(py::module_& m) {
  py::class_<DeviceStream, std::shared_ptr<DeviceStream>>(m, "DeviceStream");
  py::class_<DeviceEvent, std::shared_ptr<DeviceEvent>>(m, "DeviceEvent")
      .def_property_readonly(
          "handle", [](DeviceEvent& e) { return reinterpret_cast<uintptr_t>(e.native_handle()); },
          "The cudaEvent_t on CUDA (an identity on the emulated device).");
  py::class_<DeviceGraph, std::shared_ptr<DeviceGraph>>(m, "DeviceGraph");
  py::class_<DeviceGraphExec, std::shared_ptr<DeviceGraphExec>>(m, "DeviceGraphExec");

  // Every call from Python runs with its device current and restores the thread's previous one,
  // as torch's device guards do (the emulated device enforces CUDA's per-thread current device).
  py::class_<Device, std::shared_ptr<Device>> device_class(m, "Device");
  bind_capture(device_class);
  device_class.def_property_readonly("name", &Device::name)
      .def("allocate",
           [](Device& d, size_t bytes) {
             DeviceGuard g(d);
             return reinterpret_cast<uintptr_t>(d.allocate(bytes));
           })
      .def("free_async",
           [](Device& d, uintptr_t p, DeviceStream& s) {
             DeviceGuard g(d);
             d.free_async(reinterpret_cast<void*>(p), s);
           },
           py::call_guard<ReleaseGil>())
      .def("free_ordered",
           [](Device& d, uintptr_t p, DeviceStream& s) {
             DeviceGuard g(d);
             d.free_ordered(reinterpret_cast<void*>(p), s);
           })
      .def("create_stream",
           [](Device& d) {
             DeviceGuard g(d);
             return d.create_stream();
           })
      .def("create_event",
           [](Device& d) {
             DeviceGuard g(d);
             return d.create_event();
           })
      .def("record",
           [](Device& d, DeviceEvent& e, DeviceStream& s) {
             DeviceGuard g(d);
             d.record(e, s);
           })
      .def("wait_event",
           [](Device& d, DeviceStream& s, std::shared_ptr<DeviceEvent> e, bool external) {
             DeviceGuard g(d);
             if (!external) return d.wait_event(s, *e);
             d.wait_event_external(s, *e);
             d.retain_in_capture(s, std::move(e));  // the graph holds the event (a CUDA user object)
           },
           py::arg("stream"), py::arg("event"), py::arg("external") = false,
           "cudaStreamWaitEvent; external=True: with cudaEventWaitExternal (a capturing stream only: an external "
           "event wait node, the event held by the graph being captured)")
      .def("query",
           [](Device& d, DeviceEvent& e) {
             DeviceGuard g(d);
             return d.query(e);
           })
      .def(
          "synchronize_event",
          [](Device& d, DeviceEvent& e) {
            DeviceGuard g(d);
            d.synchronize(e);
          },
          py::call_guard<ReleaseGil>())
      .def(
          "synchronize_stream",
          [](Device& d, DeviceStream& s) {
            DeviceGuard g(d);
            d.synchronize(s);
          },
          py::call_guard<ReleaseGil>())
      .def("copy",
           [](Device& d, uintptr_t dst, uintptr_t src, size_t bytes, DeviceStream& s) {
             DeviceGuard g(d);
             d.copy(reinterpret_cast<void*>(dst), reinterpret_cast<const void*>(src), bytes, s);
           })
      // Host -> device from a private copy of `data`, so the caller may reuse its buffer at once.
      .def("upload",
           [](Device& d, uintptr_t dst, py::bytes data, DeviceStream& s) {
             DeviceGuard g(d);
             auto staging = std::make_shared<std::string>(data);
             char* host = staging->data();
             d.copy(reinterpret_cast<void*>(dst), host, staging->size(), s);
             // Keep the staging bytes alive until the stream has copied them.
             d.host_func([staging] {}, s);
           })
      .def("reduce",
           [](Device& d, uintptr_t dst, uintptr_t src, size_t n, DType dtype, RedOp op, DeviceStream& s) {
             DeviceGuard g(d);
             d.reduce(reinterpret_cast<void*>(dst), reinterpret_cast<const void*>(src), n, dtype, op, s);
           })
      .def("scale_copy",
           [](Device& d, uintptr_t dst, uintptr_t src, size_t n, DType dtype, double scale, DeviceStream& s) {
             DeviceGuard g(d);
             d.scale_copy(reinterpret_cast<void*>(dst), reinterpret_cast<const void*>(src), n, dtype, scale, s);
           })
      .def("divide", [](Device& d, uintptr_t dst, size_t n, DType dtype, int64_t divisor, DeviceStream& s) {
        DeviceGuard g(d);
        d.divide(reinterpret_cast<void*>(dst), n, dtype, divisor, s);
      });

  py::class_<EmulatedDevice, Device, std::shared_ptr<EmulatedDevice>>(m, "EmulatedDevice")
      .def_property_readonly("delay_us", &EmulatedDevice::delay_us)
      .def("allocated_bytes", &EmulatedDevice::allocated_bytes)
      .def("driver_calls", &EmulatedDevice::driver_calls,
           "Driver calls made on this device so far, by the CUDA call each stands for (tests pin a call's "
           "structure: launches, event records and waits, host functions).")
      .def("set_default_stream", &EmulatedDevice::set_default_stream, py::arg("stream"),
           "The stream commlib.emulated uses as this device's default stream (identity 0 of the C++ entry).")
      .def("stream_named", &EmulatedDevice::stream_named, py::arg("identity"),
           "The live stream of this device with that identity (_C.stream_identity; 0: the default stream), None "
           "if there is none: what a __cuda_array_interface__ over emulated memory names as its stream.")
      .def("inject_fault", &EmulatedDevice::inject_fault, py::arg("kind"))
      .def_property_readonly("fault", &EmulatedDevice::fault)
      // Emulated memory is host memory: read it back directly (after a synchronize).
      .def("read", [](EmulatedDevice&, uintptr_t src, size_t bytes) {
        return py::bytes(reinterpret_cast<const char*>(src), bytes);
      });
  // Devices and streams implemented in another module (commlib._C_cuda) arrive as capsules.
  m.def("device_from_capsule", [](py::capsule c) {
    if (std::strcmp(c.name(), "commlib.Device") != 0) throw std::invalid_argument("device: not a commlib.Device capsule");
    return *static_cast<std::shared_ptr<Device>*>(c.get_pointer());
  });
  m.def("stream_from_capsule", [](py::capsule c) {
    if (std::strcmp(c.name(), "commlib.DeviceStream") != 0)
      throw std::invalid_argument("stream: not a commlib.DeviceStream capsule");
    return *static_cast<std::shared_ptr<DeviceStream>*>(c.get_pointer());
  });
  m.def(
      "load_nccl",
      [](const std::vector<std::string>& candidates) {
        const NcclApi& api = load_nccl(candidates);
        return py::make_tuple(api.version, api.path);
      },
      py::arg("candidates"), "dlopen libnccl (first loadable candidate); returns (version code, path).");
  m.def("emulated_rule_counts", [] {
    const EmulatedRuleCounts c = emulated_rule_counts();
    py::dict d;
    d["stray_contexts"] = c.stray_contexts;
    d["host_function_violations"] = c.host_function_violations;
    d["frees_while_busy"] = c.frees_while_busy;
    d["exports_freed_while_mapped"] = c.exports_freed_while_mapped;
    d["last_violation"] = c.last_violation;
    d["host_functions"] = c.host_functions;
    d["events_created"] = c.events_created;
    d["events_alive"] = c.events_alive;
    return d;
  }, "How often this process broke the CUDA rules the emulated device checks (see commlib.emulated).");
  m.def(
      "emulated_kernel_counters",
      [](bool reset) {
        static const char* const names[] = {"bytes_read", "bytes_written", "staged_bytes", "system_fences",
                                            "handshakes", "grid_barriers", "block_runs", "host_reads",
                                            "host_writes", "host_data_accesses", "message_launches",
                                            "message_blocks", "peer_waits", "check_exchanges", "folded_checks",
                                            "trace_stores", "abort_polls", "one_sided_launches"};
        static_assert(sizeof(names) / sizeof(names[0]) == kexec::kEmuCounters, "a name per counter");
        const auto c = emulated_kernel_counters();
        if (reset) reset_emulated_kernel_counters();
        py::dict d;
        for (unsigned i = 0; i < kexec::kEmuCounters; ++i) d[names[i]] = c[i];
        return d;
      },
      py::arg("reset") = false, "The emulated device's counts of kernel launches (commlib.emulated).");
  m.def(
      "device_links",
      [](const std::vector<int>& host_of, int rank, const std::string& setting) {
        const LinkTopology topo{host_of};
        std::vector<std::string> names(host_of.size());
        const auto links = connect_device_links(topo, rank, parse_device_link_setting(setting));
        for (size_t p = 0; p < links.size(); ++p)
          if (links[p]) names[p] = links[p]->name();
        return py::make_tuple(names, some_pair_uses(topo, parse_device_link_setting(setting), "nccl"));
      },
      py::arg("host_of"), py::arg("rank"), py::arg("setting"),
      "The stream engine's choice (stream/device_link.h) for a host map: (rank's link to every rank, 'ipc' or "
      "'nccl' ('' for itself), whether some pair of the world uses nccl). ValueError naming COMMLIB_DEVICE_LINK "
      "for a pair no link connects or an unknown setting.");
  m.def("device_auto_slot_bytes", &auto_slot_bytes, py::arg("ranks"), py::arg("nslots"),
        "The stream engine's inbox slot size for COMMLIB_DEVICE_SLOT_BYTES=0 (auto) at this world size and slot "
        "count (stream/stream_engine.h).");
  m.def("emulated_hold_queries", &hold_other_threads_queries, py::arg("close"),
        "Test hook: while closed, event queries from other threads than the caller's wait (at most 5 s each).");
  m.def("emulated_thread_driver_calls", &emulated_thread_driver_calls,
        "This thread's driver calls on every emulated device so far, by name, with the device guards' "
        "cudaGetDevice/cudaSetDevice (the caller's side of a call, without the watchdog's).");
  m.def("thread_allocations", &thread_allocations,
        "Heap allocations commlib's C++ code made on this thread so far (common/alloc_count.h: operator new "
        "and new[], without the emulated device's own).");
  m.def("emulated_queries_held", &queries_held_at_gate, "Test hook: queries waiting at the gate now.");
  m.def("emulated_device", &emulated_device, py::arg("index") = 0,
        "The process's emulated device `index` (COMMLIB_EMULATED_DELAY_US read when first created).");

  py::class_<StreamEngine, std::shared_ptr<StreamEngine>>(m, "StreamEngine")
      .def(py::init([](Communicator& comm, std::shared_ptr<Device> device, double timeout, const std::string& label) {
             return std::make_shared<StreamEngine>(std::move(device), communicator_peer_control(comm),
                                                   comm.plan_context(),
                                                   stream_engine_options_from_env(timeout, label));
           }),
           py::arg("comm"), py::arg("device"), py::arg("timeout"), py::arg("label") = "", py::keep_alive<1, 2>())
      .def("local_handle", &StreamEngine::local_handle)
      .def("connect", &StreamEngine::connect, py::arg("handles"), py::arg("host_of"),
           "Chooses the link of every pair (COMMLIB_DEVICE_LINK and the host map, stream/device_link.h), then maps "
           "the control regions and inboxes of the peers on this rank's host.")
      .def_property_readonly("link_setting", [](StreamEngine& e) { return device_link_setting_name(e.link_setting()); },
                             "COMMLIB_DEVICE_LINK as this engine read it (auto, ipc or nccl).")
      .def("links", &StreamEngine::link_names,
           "This rank's link to every rank: 'ipc' or 'nccl' ('' for itself), as connect() chose them.")
      .def("needs_nccl", &StreamEngine::needs_nccl,
           "Whether some pair of the communicator uses the nccl link (then every rank creates NCCL's communicator).")
      .def("last_path", &StreamEngine::last_path,
           "The path the last collective ran on: 'kernel', 'copy' or '' (COMMLIB_DEVICE_PATH).")
      .def(
          "kernel_chunks",
          [](StreamEngine& e) {
            const KernelPath::ChunksMoved m = e.kernel_path() ? e.kernel_path()->chunks_moved() : KernelPath::ChunksMoved{};
            return py::dict(py::arg("ll") = m.ll, py::arg("slots") = m.slots);
          },
          "Message chunks (sent and received) the kernel path's launches moved so far, by protocol: "
          "{'ll': .., 'slots': ..}, as the kernel recorded them (read after the calls completed).")
      .def("kernel_plan_lookups",
           [](StreamEngine& e) { return e.kernel_path() ? e.kernel_path()->plan_lookups() : 0; },
           "Device-plan lookups by call shape the kernel path made (none for a cached call's launches).")
      .def("plan_cache_lookups", &StreamEngine::plan_cache_lookups, "Lookups in the engine's plan cache so far.")
      .def("kernel_replays_done",
           [](StreamEngine& e) { return e.kernel_path() ? e.kernel_path()->replays_done() : 0; },
           "Kernel-path launches run by replays of captured graphs so far, as the kernel counted them.")
      .def(
          "start_kernel_chunk_numbers_at",
          [](StreamEngine& e, uint64_t n) {
            if (!e.kernel_path()) throw std::invalid_argument("this engine has no kernel path (COMMLIB_DEVICE_PATH=copy)");
            e.kernel_path()->start_chunk_numbers_at(n);
          },
          py::arg("n"),
          "Test hook: every pair's kernel-path chunk numbers continue from n (every rank the same, between "
          "drained calls): crosses the LL flags' epoch in a few calls.")
      .def("events_created", &StreamEngine::events_created,
           "Completion events the engine created so far (pooled: O(calls in flight), not one per call).")
      .def("hide_kernel_calls_from_control_plane", &StreamEngine::hide_kernel_calls_from_control_plane,
           "Test hook: kernel-path calls are not published on the control plane, so only the kernel's own "
           "descriptor check can find a mismatch.")
      .def("mapped_peers", &StreamEngine::mapped_peers,
           "Peers whose control region this rank mapped (those on its host).")
      .def(
          "run",
          [](StreamEngine& e, Collective coll, const std::string& algo, uintptr_t in, uintptr_t out, int64_t count,
             DType dtype, RedOp op, int root, double scale, DeviceStream& stream) {
            const CollectiveCall call = device_call(coll, algo, in, out, count, dtype, op, root, scale);
            ReleaseGil nogil;
            return e.collective(call, stream);
          },
          py::arg("collective"), py::arg("algorithm"), py::arg("input"), py::arg("output"), py::arg("count"),
          py::arg("dtype"), py::arg("op"), py::arg("root"), py::arg("scale"), py::arg("stream"))
      .def(
          "resolved_algorithm",
          [](StreamEngine& e, Collective coll, const std::string& algo, int64_t count, DType dtype, int root) {
            return e.resolved_algorithm(device_call(coll, algo, 0, 0, count, dtype, RedOp::Sum, root, 1.0));
          },
          py::arg("collective"), py::arg("algorithm"), py::arg("count"), py::arg("dtype"), py::arg("root") = 0,
          "The algorithm a call of this shape runs on this engine (auto resolved as the host does).")
      .def(
          "p2p",
          [](StreamEngine& e, const std::vector<P2PTuple>& items, DType dtype, DeviceStream& stream, std::optional<int64_t> n) {
            const std::vector<P2PItem> v = p2p_items(items);
            ReleaseGil nogil;
            return n ? e.all_to_allv(v, dtype, *n, stream) : e.p2p(v, dtype, stream);
          },
          py::arg("items"), py::arg("dtype"), py::arg("stream"), py::arg("a2av_count") = py::none(),
          "Enqueues sends/receives ((send, address, count, peer) each) on `stream`; a2av_count: all_to_allv's.")
      .def(
          "check_first_call",
          [](StreamEngine& e, Collective coll, const std::string& algo, int64_t count, DType dtype, RedOp op, int root) {
            e.check_first_call(device_call(coll, algo, 0, 0, count, dtype, op, root, 1.0));
          },
          py::arg("collective"), py::arg("algorithm"), py::arg("count"), py::arg("dtype"), py::arg("op"),
          py::arg("root"),
          "While the first call waits for the peers' engines: raises MismatchError if a peer is in a host call of "
          "that number, or the error of a failed peer.")
      .def(
          "check_first_p2p",
          [](StreamEngine& e, const std::vector<P2PTuple>& items, DType dtype) {
            e.check_first_p2p(p2p_items(items), dtype);
          },
          py::arg("items"), py::arg("dtype"),
          "While a first call of sends/receives waits for the peers' engines: raises MismatchError if a peer sent "
          "the message a receive expects from a host buffer.")
      // NCCL (nccl_load, nccl_init, ...): bindings/device_nccl_bindings.cc.
      .def_property_readonly("device_name", [](StreamEngine& e) { return e.device().name(); })
      .def("abort", &StreamEngine::abort)
      .def("failed", &StreamEngine::failed)
      .def("close", &StreamEngine::close, py::call_guard<ReleaseGil>())
      .def("release_memory", &StreamEngine::release_memory, py::arg("peers_closed"), py::call_guard<ReleaseGil>());
}

}  // namespace commlib
