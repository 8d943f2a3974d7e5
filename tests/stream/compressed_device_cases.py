"""Rank-side checks of compress= on device buffers (docs/compression.md "On device buffers"): each
case runs a collective compressed on host (NumPy) buffers, then the same call on emulated device
arrays through the stream engine, and reports digests of both outputs, so the pytest side requires
the device result equal to the host engine's bit for bit and identical on every rank.

Stochastic rounding draws from the call's seed advanced by its number (plan/codec_pieces.h
call_codec), and host and device calls share one numbering: the device call, numbered one after
the host call, gets the seed minus one step, so both calls draw the same stream."""
from __future__ import annotations

import hashlib

import numpy as np

import commlib
import commlib.emulated as emu
from commlib.codecs import Codec
from kernel_path_cases import with_settings
from mismatch_data_cases import comm_error

GOLDEN = 0x9E3779B97F4A7C15
BLOCK = 8


def _values(rank: int, n: int, dtype: str) -> np.ndarray:
    rng = np.random.default_rng(1000 * rank + n)
    v = (rng.standard_normal(n) * np.exp(rng.uniform(-3, 3, n)) * (1 + rank)).astype(np.float32)
    if dtype == "bfloat16":
        u = v.view(np.uint32).astype(np.uint64)
        return ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)
    return v.astype(dtype)


def _host(a: np.ndarray, dtype: str):
    if dtype != "bfloat16":
        return a.copy()
    import torch
    return torch.from_numpy(a.copy()).view(torch.bfloat16)


def _host_bits(h) -> bytes:
    return h.view(__import__("torch").int16).numpy().tobytes() if hasattr(h, "numpy") else np.asarray(h).tobytes()


def _dev(a: np.ndarray, dtype: str):
    return emu.from_numpy(a.copy(), dtype="bfloat16") if dtype == "bfloat16" else emu.from_numpy(a.copy())


def _call(comm, coll, algo, buf, codec, count, P, op):
    """Runs one call on buffers made by `buf(values)`; returns the output buffer."""
    if coll == "all_reduce":
        x = buf(_values(comm.rank, count, DT[0]))
        comm.all_reduce(x, op=op, algorithm=algo, compress=codec)
        return x
    if coll == "reduce_scatter":
        x = buf(_values(comm.rank, count * P, DT[0]))
        out = buf(np.zeros(count, DT[1]))
        comm.reduce_scatter(out, x, op=op, algorithm=algo, compress=codec)
        return out
    out = buf(np.zeros(count * P, DT[1]))
    x = buf(_values(comm.rank, count, DT[0]))
    comm.all_gather(out, x, algorithm=algo, compress=codec)
    return out


DT = [None, None]  # (dtype name, NumPy dtype of its storage) of the case running


def run_cases(comm, cases):
    """Per case (collective, algorithm, codec, dtype, rounding, count, op[, inter_only]): the case,
    the digest of the host engine's output and of the device's."""
    warm = emu.from_numpy(np.zeros(4, np.float32))
    comm.all_reduce(warm)  # the engine's set-up, before the numbered pairs below
    results = []
    for coll, algo, codec, dtype, rounding, count, op, *inter in cases:
        DT[0], DT[1] = dtype, np.uint16 if dtype == "bfloat16" else dtype
        inter_only = bool(inter and inter[0])
        host_codec = Codec(codec, BLOCK, rounding, seed=5, inter_only=inter_only)
        dev_codec = Codec(codec, BLOCK, rounding, seed=(5 - GOLDEN) % (1 << 64),  # see the module's docstring
                          inter_only=inter_only)
        h = _call(comm, coll, algo, lambda v: _host(v, dtype), host_codec, count, comm.size, op)
        d = _call(comm, coll, algo, lambda v: _dev(v, dtype), dev_codec, count, comm.size, op)
        hb, db = _host_bits(h), d.numpy().tobytes()
        results.append(((coll, algo, codec, dtype, rounding, count, op, *inter), hashlib.sha1(hb).hexdigest(),
                        hashlib.sha1(db).hexdigest()))
    return results


def run_cases_with(comm, settings, cases):
    """run_cases on a sub-communicator whose host communicator and stream engine are made with
    ``settings`` (COMMLIB_COMPRESS_PIECE_BYTES, COMMLIB_DEVICE_SLOT_BYTES) in the environment."""
    return with_settings(comm, settings, run_cases, cases)


def refusals(comm):
    """Bad input on device buffers is refused naming the argument, before anything is sent."""
    said = []
    x = emu.from_numpy(np.ones(8, np.int32))
    for what, call in (("compress", lambda: comm.all_reduce(x, compress="int8")),
                       ("compress", lambda: comm.all_reduce(emu.from_numpy(np.ones(8, np.float32)), compress="int3")),
                       ("compress", lambda: comm.all_reduce(emu.from_numpy(np.ones(8, np.float32)), compress=3)),
                       ("algorithm", lambda: comm.all_reduce(emu.from_numpy(np.ones(8, np.float32)),
                                                             algorithm="nccl", compress="int8"))):
        try:
            call()
            said.append(f"{what}: not refused")
        except (ValueError, TypeError) as e:
            if not str(e).startswith(what):
                said.append(f"{what}: refused as {e!r}")
    y = emu.from_numpy(np.arange(8, dtype=np.float32))
    comm.all_reduce(y, compress="int8")  # the communicator still works, numbered alike on every rank
    try:  # a compressed call is never captured (it would run uncompressed on the kernel path)
        with emu.graph(emu.Graph()):
            comm.all_reduce(y, compress="int8")
        said.append("capture: not refused")
    except Exception as e:  # noqa: BLE001 - the message is the result
        if "compress= runs on the copy path" not in str(e):
            said.append(f"capture: refused as {e!r}")
    comm.all_reduce(y, compress="int8")
    return said, y.numpy().tobytes()


def proven(coll: str, size: int, count: int, host_of=None, inter_only=False) -> list:
    """The algorithms the verifier proves for compress= at this size and count (what the device
    lowering runs; the rest are refused on host and device alike), on the host map ``host_of``
    (default: one host) with or without compress_inter_only."""
    out = []
    for algo in commlib.algorithms(coll):
        try:
            commlib.codecs.verify(coll, algo, size, count, host_of=host_of, inter_only=inter_only)
            out.append(algo)
        except commlib.VerificationError:
            pass
    return out


def steady_calls(comm, settings, n=12, count=20000):
    """On a sub-communicator made with ``settings``: (the growth of this process's device memory
    over the first compressed call, an in-place ring all_reduce of ``count`` x P float32: the
    staging its largest step needs; the device driver calls of n steady rounds of compressed calls
    (all_reduce in place, reduce_scatter and all_gather out of place) enqueued back to back after
    one round of the same shapes; every round's outputs identical to the first round's)."""
    def run(sub):
        P = sub.size
        dev = emu.device()
        ins = [emu.from_numpy(_values(sub.rank, count * P, "float32")) for _ in range(3)]
        outs = [emu.from_numpy(np.zeros(count * P, np.float32)) for _ in range(3)]
        codec = Codec("int8", BLOCK, "nearest", seed=3)
        warm = emu.from_numpy(np.zeros(4, np.float32))  # kept: its memory is not freed inside the count
        sub.all_reduce(warm)  # the engine's set-up, uncompressed
        emu.current_stream().synchronize()
        before = dev.allocated_bytes()
        outs[0].copy_(ins[0])
        sub.all_reduce(outs[0], algorithm="ring", compress=codec)
        emu.current_stream().synchronize()
        grown = dev.allocated_bytes() - before

        def round_():
            sub.all_reduce(outs[0], algorithm="ring", compress=codec)
            sub.reduce_scatter(outs[1][:count], ins[1], compress=codec)
            sub.all_gather(outs[2], ins[2][:count], compress=codec)

        def reset():
            for a, b in zip(outs, ins):
                a.copy_(b)

        reset()
        round_()  # the first of each shape (the private input copies of out-of-place calls grow)
        emu.current_stream().synchronize()
        first = [o.numpy().tobytes() for o in outs]
        counts, same = {}, True
        for _ in range(n):
            reset()
            c0 = dev.driver_calls()
            round_()
            c1 = dev.driver_calls()
            for k in c1:
                counts[k] = counts.get(k, 0) + c1[k] - c0.get(k, 0)
            emu.current_stream().synchronize()
            same &= [o.numpy().tobytes() for o in outs] == first
        return grown, {k: v for k, v in counts.items() if v}, same
    return with_settings(comm, settings, run)


def piece_mismatch(comm):
    """Rank 0 codes in other pieces (COMMLIB_COMPRESS_PIECE_BYTES: the pieces lay a message out, so
    the size is in the call descriptor's codec word): every rank's compressed device call fails with
    a MismatchError naming compress=, at its wait() or at the call, and leaves its output as it was.
    Returns (output unchanged, the error, the error at close())."""
    from commlib.settings import overridden
    with overridden({"COMMLIB_COMPRESS_PIECE_BYTES": "256" if comm.rank == 0 else "512"}):
        sub = comm.split(0, timeout=60)
        warm = emu.from_numpy(np.ones(8, np.float32))
        sub.all_reduce(warm)  # the engine, made with the setting, before the mismatched call
        warm.numpy()
    x = emu.from_numpy(_values(comm.rank, 300, "float32"))
    before = x.numpy().copy()
    works = []
    said = comm_error(lambda: works.append(sub.all_reduce(x, compress="int8", async_op=True)))
    after = x.numpy()
    if works and works[0] is not None:
        said = comm_error(works[0].wait)
    return bool(np.array_equal(before, after)), said, comm_error(sub.close)


def kill_during_compressed(comm, victim):
    """``victim`` dies (SIGKILL) inside a compressed device all_reduce (hierarchical under
    compress_inter_only, in pieces of 4 KiB: raw messages within a host, encoded ones between
    hosts); every other rank's call raises PeerError naming it and the call, through the watchdog,
    not the timeout (tests/host/error_cases.py kill_during_collective's scenario: one other rank
    joins only after the kill, so the victim dies waiting for its data)."""
    import time

    from commlib.settings import overridden
    from commlib.testing.faults import arm_death
    with overridden({"COMMLIB_COMPRESS_PIECE_BYTES": "4096"}):
        sub = comm.split(0, timeout=60)
        x = emu.from_numpy(np.ones(1 << 16, np.float32))
        sub.all_reduce(x)  # the engine, made with the setting
        x.numpy()
    codec = Codec("int8", inter_only=True)
    arm_death(sub, victim)
    t = time.monotonic()
    try:
        sub.all_reduce(x, algorithm="hierarchical", compress=codec, async_op=True).synchronize()
        if sub.rank == victim:
            time.sleep(5)  # the kill arrives meanwhile
        return None
    except commlib.PeerError as e:
        return str(e), time.monotonic() - t
    except Exception as e:  # noqa: BLE001 - reported, so the assertion names the rank
        return f"wrong type {type(e).__name__}: {e}", time.monotonic() - t
