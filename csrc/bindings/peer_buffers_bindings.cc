// Peers' buffers (device/peer_buffers.h), the allocation view the registry is built on
// (Device::memory_range) and the emulated device's allocation hooks, for commlib.device and tests.
#include <pybind11/stl.h>

#include "bindings/bindings.h"
#include "bindings/gil.h"
#include "device/emulated/emulated_device.h"
#include "device/peer_buffers.h"
#include "stream/kernel_occupancy.h"
#include "stream/stream_engine.h"

namespace py = pybind11;

namespace commlib {

namespace {

py::tuple tag(const PeerBufferTag& t) { return py::make_tuple(t.id, t.offset); }

py::dict stats_dict(const PeerBuffers::Stats& s) {
  py::dict d;
  d["registered"] = s.registered;
  d["retired"] = s.retired;
  d["imported"] = s.imported;
  d["closed"] = s.closed;
  d["hits"] = s.hits;
  d["misses"] = s.misses;
  d["waits"] = s.waits;
  d["mispredicted"] = s.mispredicted;
  d["unshareable"] = s.unshareable;
  d["arena_hits"] = s.arena_hits;
  d["agree_sleeps"] = s.agree_sleeps;
  return d;
}

KernelPath& kernel_of(StreamEngine& e) {
  if (!e.kernel_path()) throw std::invalid_argument("engine: no kernel path (COMMLIB_DEVICE_PATH=copy)");
  return *e.kernel_path();
}

py::dict view_dict(const PeerBufferView& v) {
  py::list peers, expect;
  for (size_t p = 0; p < v.peer.size(); ++p) {
    peers.append(reinterpret_cast<uintptr_t>(v.peer[p]));
    expect.append(tag(v.expect[p]));
  }
  py::dict d;
  d["own"] = tag(v.own);
  d["peers"] = peers;    // 0: not mapped (staged)
  d["expect"] = expect;  // the peer's (buffer id, offset) each address assumes
  return d;
}

}  // namespace

void bind_peer_buffers(py::module_& m) {
  m.def(
      "_peer_buffers_table_layout",
      [] {
        py::dict d;
        for (const auto& [name, value] : PeerBuffers::table_layout()) d[py::str(name)] = value;
        return d;
      },
      "The layout of a rank's table of peers' buffers (device/peer_buffers_table.h), byte offsets and "
      "sizes by name: for tests that forge a peer's entries.");
  auto device = py::reinterpret_borrow<py::class_<Device, std::shared_ptr<Device>>>(m.attr("Device"));
  device.def(
      "memory_range",
      [](Device& d, uintptr_t ptr) {
        DeviceGuard g(d);
        const Device::MemoryRange r = d.memory_range(reinterpret_cast<const void*>(ptr));
        return py::make_tuple(reinterpret_cast<uintptr_t>(r.base), r.bytes, r.buffer_id, r.shareable);
      },
      py::arg("ptr"),
      "(base, bytes, buffer id, shareable) of the allocation ptr lies in (cuPointerGetAttributes); "
      "bytes 0: not memory of this device.");
  device.def(
      "plan_residency",
      [](Device& d) {
        DeviceGuard g(d);
        const Device::Residency r = residency_of(d);
        return py::make_tuple(r.device_blocks, r.client_blocks, r.why);
      },
      "(blocks of the kernel executor resident at once on the device, for this process, what they were made "
      "of); 0: unknown.");
  // Test hooks: CUDA's stream memory operations on a host word (the emulated device maps any host
  // address as itself): a test holds a stream at a gate it opens later.
  device.def(
      "wait_value",
      [](Device& d, uintptr_t addr, uint64_t value, DeviceStream& s) {
        DeviceGuard g(d);
        d.wait_value(reinterpret_cast<const uint64_t*>(addr), value, s);
      },
      py::arg("addr"), py::arg("value"), py::arg("stream"));
  device.def(
      "write_value",
      [](Device& d, uintptr_t addr, uint64_t value, DeviceStream& s) {
        DeviceGuard g(d);
        d.write_value(reinterpret_cast<uint64_t*>(addr), value, s);
      },
      py::arg("addr"), py::arg("value"), py::arg("stream"));
  auto emulated = py::reinterpret_borrow<py::class_<EmulatedDevice, Device, std::shared_ptr<EmulatedDevice>>>(
      m.attr("EmulatedDevice"));
  emulated.def(
      "allocate_with",
      [](EmulatedDevice& d, size_t bytes, uintptr_t at, bool shareable) {
        DeviceGuard g(d);
        return reinterpret_cast<uintptr_t>(d.allocate_with(bytes, reinterpret_cast<void*>(at), shareable));
      },
      py::arg("bytes"), py::arg("at") = 0, py::arg("shareable") = true,
      "Test hook: memory at address `at` (0: anywhere) and/or without a shareable handle (a VMM or pool "
      "allocation, which export refuses).");

  py::class_<PeerBuffers, std::shared_ptr<PeerBuffers>>(m, "PeerBuffers",
                                                        "Peers' buffers, registered lazily (device/peer_buffers.h).")
      .def(py::init([](std::shared_ptr<Device> d, int rank, int size, double timeout_s) {
             if (size < 1 || rank < 0 || rank >= size) throw std::invalid_argument("rank: out of range for size");
             return std::make_shared<PeerBuffers>(std::move(d), rank, size, timeout_s);
           }),
           py::arg("device"), py::arg("rank"), py::arg("size"), py::arg("timeout_s"))
      .def("local_handle", &PeerBuffers::local_handle)
      .def("connect", &PeerBuffers::connect, py::arg("handles"), py::arg("same_host"))
      .def(
          "lookup",
          [](PeerBuffers& r, std::shared_ptr<Device> d, uint64_t call, unsigned which, uintptr_t ptr, size_t bytes) {
            PeerBufferView v;
            {
              py::gil_scoped_release nogil;  // a miss waits for the peers
              DeviceGuard g(*d);
              v = r.lookup(call, which, reinterpret_cast<const void*>(ptr), bytes);
            }
            return view_dict(v);
          },
          py::arg("device"), py::arg("call"), py::arg("which"), py::arg("ptr"), py::arg("bytes"))
      .def("close",
           [](PeerBuffers& r, std::shared_ptr<Device> d) {
             DeviceGuard g(*d);
             r.close();
           })
      .def("registrations", &PeerBuffers::registrations)
      .def("imports", &PeerBuffers::imports)
      .def("stats", [](PeerBuffers& r) { return stats_dict(r.stats()); });

  // The engine's own registry (its kernel path's) and grid budget: what the kernel path's calls
  // use, reached from Python for tests and diagnostics.
  auto engine = py::reinterpret_borrow<py::class_<StreamEngine, std::shared_ptr<StreamEngine>>>(m.attr("StreamEngine"));
  engine
      .def(
          "peer_buffer_lookup",
          [](StreamEngine& e, uint64_t call, unsigned which, uintptr_t ptr, size_t bytes) {
            PeerBufferView v;
            {
              py::gil_scoped_release nogil;  // a miss waits for the peers
              DeviceGuard g(e.device());
              v = kernel_of(e).peer_buffers().lookup(call, which, reinterpret_cast<const void*>(ptr), bytes, false,
                                                     [&e] { return e.failed(); });
            }
            return view_dict(v);
          },
          py::arg("call"), py::arg("which"), py::arg("ptr"), py::arg("bytes"),
          "The kernel path's peer buffers (device/peer_buffers.h): every peer's mapped address of the same "
          "call's buffer, or 0 (staged). Collective: every rank looks up its buffer of call `call`.")
      .def(
          "symmetric_share",
          [](StreamEngine& e, uintptr_t base, size_t bytes) {
            DeviceGuard g(e.device());
            const PeerBuffers::ArenaShare s = kernel_of(e).peer_buffers().share_arena(reinterpret_cast<void*>(base), bytes);
            return py::make_tuple(s.id, s.slot);
          },
          py::arg("base"), py::arg("bytes"),
          "A symmetric arena (commlib/device/symmetric.py) registered: (buffer id, slot) for the peers (id 0: "
          "not shareable). Every rank then exchanges them and calls symmetric_map.")
      .def(
          "symmetric_map",
          [](StreamEngine& e, uintptr_t base, size_t bytes, const std::vector<std::pair<uint64_t, uint32_t>>& every) {
            std::vector<PeerBuffers::ArenaShare> shares;
            for (const auto& [id, slot] : every) shares.push_back(PeerBuffers::ArenaShare{id, slot});
            py::gil_scoped_release nogil;
            DeviceGuard g(e.device());
            kernel_of(e).peer_buffers().map_arena(reinterpret_cast<void*>(base), bytes, shares);
          },
          py::arg("base"), py::arg("bytes"), py::arg("every"),
          "Every peer's arena (its (id, slot) of symmetric_share, one per rank) mapped here, once.")
      .def(
          "symmetric_unmap",
          [](StreamEngine& e, uintptr_t base) {
            DeviceGuard g(e.device());
            kernel_of(e).peer_buffers().unmap_arena(reinterpret_cast<void*>(base));
          },
          py::arg("base"), "The peers' arenas unmapped here and this rank's registration retired (before any rank frees).")
      .def("has_kernel_path", [](StreamEngine& e) { return e.kernel_path() != nullptr; },
           "Whether the engine has a kernel path, and so a registry of peers' buffers (COMMLIB_DEVICE_PATH).")
      .def("symmetric_arenas", [](StreamEngine& e) { return kernel_of(e).peer_buffers().arenas(); })
      .def("peer_buffer_stats", [](StreamEngine& e) { return stats_dict(kernel_of(e).peer_buffers().stats()); })
      .def("peer_buffer_counts",
           [](StreamEngine& e) {
             PeerBuffers& r = kernel_of(e).peer_buffers();
             return py::make_tuple(r.registrations(), r.imports());
           })
      .def("kernel_grid_budget", [](StreamEngine& e) { return kernel_of(e).grid_budget(); },
           "The most blocks a kernel-path launch of this rank uses (0: no limit known).")
      .def("kernel_usable", [](StreamEngine& e) { return kernel_of(e).usable(); })
      .def("kernel_one_sided_grid", [](StreamEngine& e) { return kernel_of(e).one_sided_grid(); },
           "The most blocks a one-sided launch uses, the same on every rank (a block per SM within the budget).")
      .def("kernel_staging_arena", [](StreamEngine& e) { return kernel_of(e).arena_bytes(); },
           "Bytes of the kernel path's staging arena (COMMLIB_DEVICE_STAGING=pool; 0: none yet, or pool staging off).")
      .def(
          "kernel_arena_counts",
          [](StreamEngine& e) {
            const KernelPath::ArenaCounts c = kernel_of(e).arena_counts();
            py::dict d;
            d["grown"] = c.grown;
            d["retired"] = c.retired;
            d["pinned"] = c.pinned;
            d["freed"] = c.freed;
            d["tables"] = c.tables;
            d["held_bytes"] = c.held_bytes;
            return d;
          },
          "The staging arenas (kernel_path_arena.cc): grown (shared so far), retired (grown out of, not freed), "
          "pinned (of the retired, held by a live captured graph), freed (retired arenas freed before close), tables (the "
          "peers' tables listed for the current arena, one per staged layout), held_bytes (the bytes of the current "
          "arena and the retired ones).")
      .def(
          "kernel_fail_arena_allocations", [](StreamEngine& e, bool on) { kernel_of(e).fail_arena_allocations(on); },
          py::arg("on"),
          "Test hook: this rank's next staging-arena allocations fail as out of memory (every rank then falls "
          "back to the slots).")
      .def("last_algorithm", &StreamEngine::last_algorithm,
           "The algorithm the engine's last collective ran (auto resolved per call), '' before the first.");
}

}  // namespace commlib
