"""Rank-side checks of compress= (docs/compression.md): all_reduce, reduce_scatter and all_gather
with every algorithm x codec x dtype x awkward count, against the exact result in float64 within
the stated bound, plus a digest of every output so the pytest side can require identical bytes on
every rank."""
from __future__ import annotations

import hashlib

import numpy as np

import commlib
from commlib.codecs import Codec

BLOCK = 8
COUNTS = (0, 1, 5, 37)  # empty, one, under a block, prime (several blocks)
# per codec: the bound on one encoding's error relative to its block's largest magnitude
EPS = {"int8": 1 / 127, "int4": 1 / 7, "fp8_e4m3": 1 / 16 + 2 ** -9, "fp8_e5m2": 1 / 8 + 2 ** -16, "bf16": 2 ** -8}
# the dtype's own rounding of each addition (relative)
DTYPE_EPS = {"float32": 2 ** -24, "float16": 2 ** -11, "bfloat16": 2 ** -8}
CASES = [(c, "float32", "nearest") for c in EPS] + [
    ("int8", "float16", "nearest"), ("bf16", "bfloat16", "nearest"), ("int4", "float16", "stochastic")]


def _array(values: np.ndarray, dtype: str):
    """A host buffer of dtype holding values (bfloat16: a torch tensor, NumPy has none)."""
    if dtype == "bfloat16":
        import torch
        return torch.from_numpy(values.astype(np.float32)).to(torch.bfloat16)
    return values.astype(dtype)


def _float64(buf) -> np.ndarray:
    if hasattr(buf, "numpy"):  # torch bfloat16
        return buf.float().numpy().astype(np.float64)
    return np.asarray(buf, dtype=np.float64)


def _digest(buf) -> str:
    raw = buf.view(__import__("torch").int16).numpy() if hasattr(buf, "numpy") else np.asarray(buf)
    return hashlib.sha1(np.ascontiguousarray(raw).tobytes()).hexdigest()


def _inputs(rank: int, n: int, dtype: str) -> np.ndarray:
    rng = np.random.default_rng(1000 * rank + n)
    # rounded through the dtype, so the exact reference sums what the ranks actually hold
    return _float64(_array(rng.standard_normal(n) * (1 + rank), dtype))


def _blockwise_max(a: np.ndarray, width: int) -> np.ndarray:
    out = np.empty_like(a)
    for b0 in range(0, a.size, width):
        out[b0:b0 + width] = np.abs(a[b0:b0 + width]).max()
    return out


def _check(failures, what, got, exact, scale, hops, codec, dtype):
    """|got - exact| <= hops * (codec eps + dtype eps) * scale, where scale bounds every partial
    result's magnitude near the element."""
    tol = hops * (EPS[codec] + DTYPE_EPS[dtype]) * scale + 1e-30
    bad = np.nonzero(np.abs(got - exact) > tol)[0]
    if bad.size:
        i = bad[0]
        failures.append(f"{what}: element {i} = {got[i]}, exact {exact[i]}, bound {tol[i]}")


def _refused(comm, collective, algo, n, failures, case) -> bool:
    """A schedule the verifier cannot prove identical under a codec is refused naming `algorithm`
    (rabenseifner's fold at non-powers of two re-codes shards together); the others run."""
    try:
        commlib.codecs.verify(collective, algo, comm.size, n)
        return False
    except commlib.VerificationError:
        pass
    x = np.ones(n * (comm.size if collective != "all_reduce" else 1), dtype=np.float32)
    out = np.ones(n if collective != "all_gather" else n * comm.size, dtype=np.float32)
    call = {"all_reduce": lambda: comm.all_reduce(x, algorithm=algo, compress="int8"),
            "reduce_scatter": lambda: comm.reduce_scatter(out, x, algorithm=algo, compress="int8"),
            "all_gather": lambda: comm.all_gather(out, x[:n], algorithm=algo, compress="int8")}[collective]
    try:
        call()
        failures.append(f"{case}: ran although the verifier rejects it")
    except ValueError as e:
        if "algorithm" not in str(e):
            failures.append(f"{case}: refused without naming the algorithm: {e}")
    return True


def check_compressed(comm, collective: str):
    """Runs one collective's matrix on this rank, streamed in one-block pieces (float32; float16:
    two blocks) so every message of more than a block is coded, sent and decoded piece by piece;
    returns (failures, [(case, digest)])."""
    from streaming_cases import streamed
    sub = streamed(comm, str(4 * BLOCK))
    try:
        return _check_compressed(sub, collective)
    finally:
        sub.close()


def _check_compressed(comm, collective: str):
    p, r = comm.size, comm.rank
    failures, digests = [], []
    runnable = {(a, n): not _refused(comm, collective, a, n, failures, f"{collective} {a} n={n}")
                for a in commlib.algorithms(collective) for n in COUNTS}
    for codec_name, dtype, rounding in CASES:
        codec = Codec(codec_name, BLOCK, rounding, seed=5)
        for n in COUNTS:
            xs = [_inputs(q, n if collective != "reduce_scatter" else p * n, dtype) for q in range(p)]
            exact = np.sum(xs, axis=0) if collective != "all_gather" else np.concatenate(xs)
            # the largest partial sum near each element bounds every encoding's block maximum
            width = 2 * BLOCK
            scale = _blockwise_max(np.sum(np.abs(xs), axis=0), width) if n else np.zeros(0)
            scale = np.maximum(scale, np.roll(scale, width)) if n else scale
            mine = _array(xs[r], dtype)
            for algo in commlib.algorithms(collective):
                if not runnable[(algo, n)]:
                    continue
                case = f"{collective} {algo} {codec_name}/{rounding} {dtype} n={n}"
                if collective == "all_reduce":
                    for in_place in (False, True):
                        buf = _array(xs[r], dtype) if in_place else mine
                        out = None if in_place else _array(np.zeros(n), dtype)
                        comm.all_reduce(buf, algorithm=algo, out=out, compress=codec)
                        res = buf if in_place else out
                        _check(failures, f"{case} in_place={in_place}", _float64(res), exact, scale, p + 1,
                               codec_name, dtype)
                        digests.append((f"{case} {in_place}", _digest(res)))
                elif collective == "reduce_scatter":
                    out = _array(np.zeros(n), dtype)
                    comm.reduce_scatter(out, mine, algorithm=algo, compress=codec)
                    _check(failures, case, _float64(out), exact[r * n:(r + 1) * n], scale[r * n:(r + 1) * n],
                           p + 1, codec_name, dtype)
                else:
                    out = _array(np.zeros(p * n), dtype)
                    comm.all_gather(out, mine, algorithm=algo, compress=codec)
                    big = np.full(p * n, max((np.abs(x).max() for x in xs if x.size), default=0.0))
                    _check(failures, case, _float64(out), exact, big, p, codec_name, dtype)
                    digests.append((case, _digest(out)))
            if not np.array_equal(_float64(mine), xs[r]):
                failures.append(f"{collective} {codec_name} {dtype} n={n}: the input was changed")
    return failures, digests


def refusals(comm):
    """compress= refused before anything is sent, naming the argument: (name, message) per case."""
    import pytest
    x = np.ones(4, dtype=np.float32)
    out = []
    for what, call, exc, match in [
            ("integer data", lambda: comm.all_reduce(np.ones(4, dtype=np.int32), compress="int8"), ValueError,
             "^compress: codecs code"),
            ("float64 data", lambda: comm.reduce_scatter(np.ones(4 // comm.size or 1), np.ones(4), compress="int8"),
             ValueError, "^compress: codecs code"),
            ("unknown codec", lambda: comm.all_reduce(x, compress="int3"), ValueError, "^compress: unknown"),
            ("codec type", lambda: comm.all_reduce(x, compress=8), TypeError, "^compress: a codec name"),
            ("stream", lambda: comm.all_gather(np.ones(4 * comm.size, np.float32), x, compress="int8", stream=1),
             ValueError, "^stream: given, but the buffers are host memory"),  # device buffers take compress=
            ("broadcast", lambda: comm.broadcast(x, compress="int8"), TypeError, "compress"),
            ("all_to_all", lambda: comm.all_to_all(np.ones(4 * comm.size, np.float32),
                                                   np.ones(4 * comm.size, np.float32), compress="int8"),
             TypeError, "compress")]:
        with pytest.raises(exc, match=match):
            call()
        out.append(what)
    comm.all_reduce(x, compress="int8")  # still in step after the refusals
    return out, float(x[0])
