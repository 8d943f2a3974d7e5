"""Rank side of test_cuda_first_call_emulated.py: the C++ backend's first call on a group and device
sets the stream engine up from C++ (csrc/bindings/device_engines.h, through _C.device_setup_api:
csrc/torch_backend/device_calls.cc ``DeviceCalls::offer``), driven with ``commlib.emulated`` memory
through the backend's test seam (native_new_shape_cases.py's ``Offers``), with a spy on every
method of the Python device route that a call or a set-up goes through. Values are checked exactly
(integers, and float32 sums of small integers)."""
from __future__ import annotations

import time

import numpy as np

import commlib.emulated as emu
import commlib.errors
from commlib import _C
from commlib.testing.faults import mark_reached, wait_until_reached
from native_new_shape_cases import Offers, _fresh_calls
from spies import spy_methods

# What the Python route would be entered through: a call (run, p2p), a set-up (_engine, setup,
# symmetric_pool) or a batch of the communicator (batch_p2p goes through p2p).
ROUTE_METHODS = ("run", "p2p", "_engine", "setup", "symmetric_pool")


def _spy_on_route(o):
    """Every entry of the route in ROUTE_METHODS appends its name to o.python_calls."""
    o.python_calls.clear()
    for name in ROUTE_METHODS:
        real = getattr(o.route, name)

        def spy(*args, _name=name, _real=real, **kwargs):
            o.python_calls.append(_name)
            return _real(*args, **kwargs)
        setattr(o.route, name, spy)


def _outcome(fn):
    """("Type: message", seconds) of what fn() raised (its Work synchronized), ("", s) if nothing."""
    t = time.monotonic()
    try:
        w = fn()
        if w is not None:
            w.synchronize()
    except Exception as e:  # noqa: BLE001 - the kind and message are the result
        return f"{type(e).__name__}: {e}", time.monotonic() - t
    return "", time.monotonic() - t


def first_call_sets_up_from_cpp(comm):
    """The group's first device call, through the seam alone, sets the engine up and runs from C++;
    then a round of every collective on fresh buffers of a few counts, each through the seam alone.
    Then a call through the Python communicator on the same device adopts the engine C++ set up (no
    second set-up). Returns (the route's entries the spy saw before the Python call, first call ran,
    engines set up, wrong results, the Python call's result right, engines after it)."""
    P, r = comm.size, comm.rank
    o = Offers(comm)
    _spy_on_route(o)
    # The backend read the route's call cache when it was made: the first call reads nothing of the
    # Python group (its communicator's fast entry takes the Python path from here: no cache address).
    o.comm._device_calls = None
    engines0 = len(o.route._setups.engines())
    first = emu.from_numpy(np.full(8, r + 1, np.float32))
    w = o.seam("all_reduce", first)
    ran = w is not None
    wrong = []
    if ran:
        w.synchronize()
        if not np.array_equal(first.numpy(), np.full(8, P * (P + 1) // 2, np.float32)):
            wrong.append(f"first all_reduce: {first.numpy()[:4]}")
    done = []
    for i, n in enumerate((0, 1, 13, 1000)):
        for k, (w, a, want) in enumerate(_fresh_calls(_SeamOnly(o), P, r, n, i)):
            if w is None:
                wrong.append(f"count {n} call {k}: declined")
                continue
            done.append((w, a, want, f"count {n} call {k}"))
    for w, a, want, what in done:
        w.synchronize()
        if want is not None and not np.array_equal(a.numpy(), want):
            wrong.append(f"{what}: {a.numpy()[:4]} expected {want[:4]}")
    seen = list(o.python_calls)
    engines = len(o.route._setups.engines()) - engines0
    x = emu.from_numpy(np.full(5, r, np.int32))
    o.comm.all_reduce(x)  # the Python entry on the same device: the route adopts C++'s engine
    right = bool(np.array_equal(x.numpy(), np.full(5, P * (P - 1) // 2, np.int32)))
    engines_after = len(o.route._setups.engines()) - engines0
    o.shutdown()
    return seen, ran, engines, wrong, right, engines_after


def first_batch_sets_up_from_cpp(comm, n=64):
    """The group's first device call is a ring of sends and receives through the backend's hold
    and batches (the seam ``_device_p2p``): its engine is set up from C++ too (the first batch's
    receives checked against the peers' host messages while the ranks meet), one engine batch,
    exact. Returns (the route's entries seen, batches run from C++, the message right)."""
    P, r = comm.size, comm.rank
    o = Offers(comm)
    _spy_on_route(o)
    a = emu.from_numpy(np.arange(n, dtype=np.float32) + 100 * r)
    b = emu.empty(n, "float32")
    emu.current_stream().synchronize()
    p2p0 = _C.device_native_p2p_count()
    works = o.backend._device_p2p([(False, b.data_ptr(), b.nbytes, (r - 1) % P),
                                    (True, a.data_ptr(), a.nbytes, (r + 1) % P)], 0, _C.emulated_current_stream())
    for w in works:
        w.synchronize()
    right = bool(np.array_equal(b.numpy(), np.arange(n, dtype=np.float32) + 100 * ((r - 1) % P)))
    seen, batches = list(o.python_calls), _C.device_native_p2p_count() - p2p0
    o.shutdown()
    return seen, batches, right


class _SeamOnly:
    """``Offers.call`` without the hand-over: the seam's Work or None (a declined call)."""

    def __init__(self, o):
        self._o = o

    def call(self, coll, a, b=None, count=None, root=0, op="sum"):
        return self._o.seam(coll, a, b, count, root, op)


def host_call_against_cpp_first_call(comm):
    """Rank 0's first device call sets up from C++ while rank 1 makes a host all_reduce of the same
    number: both raise MismatchError (rank 0's set-up checks the first call's descriptor against
    the peers' while it waits). Returns ("Type: message", seconds, the route's entries seen)."""
    o = Offers(comm.split(0, timeout=30))
    _spy_on_route(o)
    if o.comm.rank == 0:
        got = _outcome(lambda: o.seam("all_reduce", emu.from_numpy(np.ones(16, np.float32))))
    else:
        got = _outcome(lambda: o.comm.all_reduce(np.ones(16, np.float32)))
    seen = list(o.python_calls)
    o.shutdown()
    return got[0], got[1], seen


def peer_gone_before_its_first_call(comm):
    """Rank 1 closes its group's communicator without a device call; rank 0's first device call,
    setting up from C++, raises PeerError naming the collective and rank 1 (the control plane sees
    it gone) long before the timeout (30 s). Returns rank 0's ("Type: message", seconds), else None."""
    o = Offers(comm.split(0, timeout=30))
    if o.comm.rank == 1:
        o.shutdown()
        return None
    got = _outcome(lambda: o.seam("all_reduce", emu.from_numpy(np.ones(16, np.float32))))
    o.shutdown()
    return got


def peer_silent_past_the_timeout(comm):
    """Rank 1 makes no device call until rank 0 is done; rank 0's first device call, setting up from
    C++ under a 1.5 s timeout, raises CommError naming rank 1 and COMMLIB_TIMEOUT. Returns rank 0's
    ("Type: message", seconds), else None."""
    return _rank0_alone(comm, 1.5, lambda o: _outcome(
        lambda: o.seam("all_reduce", emu.from_numpy(np.ones(16, np.float32)))))


def _rank0_alone(comm, timeout, body):
    """``body(o)`` on rank 0 of a group with ``timeout`` while rank 1 makes no device call until
    rank 0 is done (then both shut the group down): rank 0's result, None on rank 1."""
    o = Offers(comm.split(0, timeout=timeout))
    if o.comm.rank == 1:
        wait_until_reached(o.comm, "done", [0])
        o.shutdown()
        return None
    got = body(o)
    mark_reached(o.comm, "done")
    o.shutdown()
    return got


def bad_first_call_sets_nothing_up(comm):
    """Rank 0's first device calls carry arguments the Python backend refuses (a bitwise op on
    float32, a root out of range) while rank 1 makes no device call: each is declined at once (the
    hand-over raises naming the argument) and no engine is set up, rather than rank 0 waiting in a
    set-up for a peer that never comes (3 s timeout). Returns rank 0's (what each call gave, seconds,
    engines set up), else None."""
    def bad_calls(o):
        t = time.monotonic()
        got = [_outcome(lambda: o.seam("all_reduce", emu.from_numpy(np.ones(16, np.float32)), op="band"))[0],
               _outcome(lambda: o.seam("broadcast", emu.from_numpy(np.ones(16, np.float32)), root=o.comm.size))[0]]
        return got, time.monotonic() - t, len(o.route._setups.engines())
    return _rank0_alone(comm, 3, bad_calls)


def set_up_failure_reaches_every_rank(comm):
    """Rank 1's engine cannot be made (COMMLIB_DEVICE_LINK names no link) during its first call from
    C++; rank 0, waiting in its own set-up, hears of it through the store's error key at once.
    Returns ("Type: message", seconds) of each rank."""
    o = Offers(comm.split(0, timeout=30), {"COMMLIB_DEVICE_LINK": "carrier-pigeon"} if comm.rank == 1 else {})
    got = _outcome(lambda: o.seam("all_reduce", emu.from_numpy(np.ones(16, np.float32))))
    o.shutdown()
    return got



def _torch_group():
    """A group torch made (``dist.new_group(backend="commlib")``, over torch's own store; a
    SignedStore over it under COMMLIB_SECRET), its C++ backend, and the route of its communicator."""
    import torch
    import torch.distributed as dist

    group = dist.new_group(backend="commlib")
    backend = group._get_backend(torch.device("cpu"))
    return group, backend, backend.python_group._comm._device()


def _seam_all_reduce(backend, x):
    """An int32 sum of ``x`` in place through the backend's device seam; its Work (None: declined)."""
    from commlib.core.call_spec import COLLECTIVE, DTYPE, OP
    return backend._device_collective(int(COLLECTIVE["all_reduce"]), int(DTYPE["int32"]), x.numpy().size, x.data_ptr(),
                                      x.data_ptr(), int(OP["sum"]), 0, 1.0, False, x.device_index,
                                      _C.emulated_current_stream())


def first_call_over_torchs_store(comm):
    """A group torch made (over torch's own store, or under COMMLIB_SECRET a SignedStore over it):
    the C++ backend's first device call sets the engine up through that c10d::Store from C++
    (``_use_c10d_setup_store``; signed and verified in C++ with the SignedStore's key), so not even
    the store's Python binding is called, nor the SignedStore's methods, and the route sees nothing.
    Returns (route entries seen, store operations through Python, whether the route still meets
    through the Python object, the result right (and, signed, this rank's handle verified by the
    SignedStore), the communicator's store class and whether its inner store is torch's, the
    SignedStore's methods called)."""
    import torch.distributed as dist

    from backend_cases import setup
    from commlib.bootstrap.secret import SignedStore
    setup(comm)
    P, r = comm.size, comm.rank
    group, backend, route = _torch_group()
    store = backend.python_group._comm._store
    signed = isinstance(store, SignedStore)
    x = emu.from_numpy(np.full(33, r + 1, np.int32))
    emu.current_stream().synchronize()
    python_ops = _C.python_setup_store_calls()
    # (torch's own store is a pybind object: its calls are counted by python_setup_store_calls)
    with spy_methods(route, ROUTE_METHODS) as seen, \
            spy_methods(store, ("set", "get", "check") if signed else ()) as store_seen:
        w = _seam_all_reduce(backend, x)
        if w is not None:
            w.synchronize()
    python_ops = _C.python_setup_store_calls() - python_ops
    right = w is not None and bool(np.array_equal(x.numpy(), np.full(33, P * (P + 1) // 2, np.int32)))
    python_store = route._setups.python_store()
    if signed:  # what this rank's set-up wrote is signed as SignedStore signs (its get verifies, or raises)
        pycomm = backend.python_group._comm
        right = right and len(store.get(f"{pycomm._prefix}/device1/{r}")) > 0
    over_torch = isinstance(store.inner if signed else store, dist.Store)
    dist.destroy_process_group(group)
    return seen, python_ops, python_store, right, type(store).__name__, over_torch, store_seen


# Values a peer's set-up key may hold that SignedStore.get refuses (tests/bootstrap's kinds): each a
# function of (store key, key name).
def _bad_values():
    from commlib.bootstrap import secret
    other = secret.derive_key(b"another secret, long enough", "store")
    return {
        "tampered": lambda key, name: secret.sign_value(key, name, b"handle")[:-1] + b"W",
        "replayed under another key": lambda key, name: secret.sign_value(key, name + b"/x", b"handle"),
        "another secret": lambda key, name: secret.sign_value(other, name, b"handle"),
        "unsigned": lambda key, name: b"handle",
    }


def signed_torch_store_refuses_bad_handles(comm):
    """Under COMMLIB_SECRET, for each bad value: in a fresh torch group, rank 1 plants it under its
    set-up key (past the signing, through torch's store) and makes no device call; rank 0's first
    device call reads it in its set-up from C++. Returns on rank 0 {kind: ("Class: message" raised,
    the SignedStore's own error reading that key, store operations through Python)} (rank 1: None)."""
    import torch.distributed as dist

    from backend_cases import setup
    setup(comm)
    out = {}
    for kind, bad in _bad_values().items():
        group, backend, route = _torch_group()
        pycomm = backend.python_group._comm
        key = f"{pycomm._prefix}/device1/1"
        if comm.rank == 1:
            pycomm._store.inner.set(key, bad(pycomm._store._key, key.encode()))
        dist.barrier(group=group)
        if comm.rank == 0:
            ops = _C.python_setup_store_calls()
            try:
                w = _seam_all_reduce(backend, emu.from_numpy(np.ones(8, np.int32)))
                if w is not None:
                    w.synchronize()
                got = ""
            except Exception as e:  # noqa: BLE001 - the class and message are the result
                # ("Class: message", with the class's name only where it is commlib.errors' own)
                own = isinstance(e, commlib.errors.RendezvousError) or type(e).__name__ != "RendezvousError"
                got = f"{type(e).__name__ if own else 'a look-alike of RendezvousError'}: {e}"
            ops = _C.python_setup_store_calls() - ops
            try:
                pycomm._store.get(key)
                expected = "no error"
            except Exception as e:  # noqa: BLE001 - the class and message are the result
                expected = f"{type(e).__name__}: {e}"
            out[kind] = (got, expected, ops)
        dist.barrier(group=dist.group.WORLD)
        dist.destroy_process_group(group)
    return out if comm.rank == 0 else None
