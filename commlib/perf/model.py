"""The alpha-beta-gamma cost model (docs/simulator.md "Closed forms"), and its least-squares fit to measurements.

Every algorithm's time is (to the simulator's critical path) linear in the three machine parameters::

    T(n, P) = a(n, P) * alpha + b(n, P) * beta + c(n, P) * gamma

(alpha: seconds per message, beta: seconds per byte moved, gamma: seconds per byte reduced; n is
the bench size in bytes: the whole all_reduce/broadcast buffer, the all_gather output, the
reduce_scatter input, the all_to_all buffer). :func:`coefficients` gives (a, b, c) for every
registered algorithm, from its schedule run by the simulator; :func:`fit` finds non-negative (alpha, beta, gamma) minimising the squared error of
log(time) over all measurements of one transport and world size (relative, so 8-byte latencies weigh
as much as 16 MiB bandwidths). Peers (gloo, MPI) hide their algorithms; they are fitted as if they ran
the textbook one (PEER_ALGORITHM).
"""
from __future__ import annotations

import functools
import itertools

import numpy as np

PEER_ALGORITHM = {"all_reduce": "ring", "all_gather": "ring", "reduce_scatter": "ring",
                  "all_to_all": "pairwise", "broadcast": "binomial", "reduce": "binomial",
                  "gather": "binomial", "scatter": "binomial"}

_HUGE_BPS = 1e300  # "infinitely fast": the term it stands for contributes nothing


def _uniform(P: int, alpha: float, Bps: float, gamma: float) -> dict:
    return {"host_of": list(range(P)), "nic_of": [0] * P, "nics_per_host": 1, "intra_latency_s": alpha,
            "intra_port_Bps": Bps, "intra_bus_Bps": 0.0, "inter_latency_s": alpha, "nic_Bps": Bps,
            "reduce_s_per_byte": gamma, "copy_s_per_byte": 0.0, "op_overhead_s": 0.0,
            "step_overhead_s": 0.0, "chunk_bytes": 0}


@functools.lru_cache(maxsize=65536)
def _simulated_coefficients(collective: str, algorithm: str, n: int, P: int):
    import commlib._C as _C
    from commlib.core.call_spec import COLLECTIVE
    blocked = collective in ("all_gather", "reduce_scatter", "all_to_all", "gather", "scatter")
    count = n // P if blocked else n  # per-rank count of 1-byte elements (ir.h)
    root = 0
    def t(alpha, Bps, gamma):
        return _C.simulate(COLLECTIVE[collective], algorithm, count, 1, root, _uniform(P, alpha, Bps, gamma))["time_s"]
    # Bytes over the "infinite" bandwidth leave ~1e-296 s behind: not a real term.
    return tuple(x if x > 1e-200 else 0.0 for x in (t(1.0, _HUGE_BPS, 0.0), t(0.0, 1.0, 0.0), t(0.0, _HUGE_BPS, 1.0)))


def coefficients(collective: str, algorithm: str, n: float, P: int):
    """(a, b, c): T = a*alpha + b*beta + c*gamma for ``n`` bytes on ``P`` ranks.

    Not a table per name: the algorithm's registered schedule is played by the simulator
    (commlib/sim, csrc/sim) on a uniform machine with one parameter switched on at a time, so a
    new algorithm is modelled as soon as its builder exists, and an unknown name is an error
    (ValueError "algorithm: ...") instead of a silent stand-in. For the algorithms with a closed form (docs/simulator.md) this
    gives exactly its closed forms (tests/sim/test_closed_forms.py)."""
    if P <= 1:
        return 0.0, 0.0, 0.0
    return _simulated_coefficients(collective, algorithm, int(n), int(P))


def model_algorithm(rec) -> str:
    """The algorithm whose formula describes a record (auto -> what it resolved to; peers -> textbook)."""
    if rec["backend"] != "commlib":
        return PEER_ALGORITHM.get(rec["collective"], "ring")
    alg = rec.get("resolved") or rec["algorithm"]
    if alg == "flags":  # auto's flag calls (each writer's one write, every rank reads it): direct's shape
        return "direct"
    return alg if alg != "auto" else PEER_ALGORITHM.get(rec["collective"], "ring")


def predict(params: dict, collective: str, algorithm: str, n: float, P: int) -> float:
    a, b, c = coefficients(collective, algorithm, n, P)
    return a * params["alpha"] + b * params["beta"] + c * params["gamma"]


def _nnls_small(A: np.ndarray, y: np.ndarray) -> np.ndarray:
    """Non-negative least squares for a handful of columns: the best feasible active set."""
    k = A.shape[1]
    best, best_err = np.zeros(k), float(np.sum(y * y))
    for m in range(1, k + 1):
        for cols in itertools.combinations(range(k), m):
            sub = A[:, cols]
            if not np.any(sub):
                continue
            x, *_ = np.linalg.lstsq(sub, y, rcond=None)
            if np.any(x < 0):
                continue
            full = np.zeros(k)
            full[list(cols)] = x
            err = float(np.sum((A @ full - y) ** 2))
            if err < best_err - 1e-30:
                best, best_err = full, err
    return best


def _log_cost(A, x, t):
    p = A @ x
    if np.any(p <= 0):
        return float("inf")
    return float(np.sum(np.log(p / t) ** 2))


def fit(samples):
    """Fit alpha, beta, gamma to [(collective, algorithm, n_bytes, P, seconds)].

    Returns {'alpha', 'beta', 'gamma' (seconds, s/B, s/B), 'n', 'rel_err_median', 'rel_err_max'}.
    gamma is 0 when nothing reduces.
    """
    rows, t = [], []
    for coll, alg, n, P, sec in samples:
        co = coefficients(coll, alg, n, P)
        if sec <= 0 or not any(co):
            continue
        rows.append(co)
        t.append(sec)
    if not rows:
        return {"alpha": 0.0, "beta": 0.0, "gamma": 0.0, "n": 0, "rel_err_median": None,
                "rel_err_max": None}
    A, t = np.array(rows, float), np.array(t, float)
    # Scale columns to comparable magnitude; start from least squares on relative error (rows / t),
    # then Gauss-Newton on log(pred) - log(t) (relative LS under-predicts when the noise is large;
    # the log fit goes through the middle of the points). Non-negative at every step.
    scale = np.where(np.abs(A).max(axis=0) > 0, np.abs(A).max(axis=0), 1.0)
    As = A / scale
    x = _nnls_small(As / t[:, None], np.ones_like(t))
    cost = _log_cost(As, x, t)
    for _ in range(30):
        p = As @ x
        if np.any(p <= 0):
            break
        step = _nnls_small(As / p[:, None], 1.0 + np.log(t / p))
        best = None
        for damp in (1.0, 0.5, 0.25, 0.1):
            cand = x + damp * (step - x)
            c = _log_cost(As, cand, t)
            if c < cost - 1e-15:
                best = (cand, c)
                break
        if best is None:
            break
        x, cost = best
    x = x / scale
    pred = A @ x
    rel = np.abs(pred - t) / t
    return {"alpha": float(x[0]), "beta": float(x[1]), "gamma": float(x[2]), "n": int(len(t)),
            "rel_err_median": float(np.median(rel)), "rel_err_max": float(rel.max())}


def fit_results(records):
    """One fit per (backend, transport, world size): {key: params} with key 'backend/transport/P'."""
    groups = {}
    for r in records:
        if r["backend"] == "commlib" and r["algorithm"] == "auto":
            continue  # the same calls as the algorithm it resolved to
        key = f"{r['backend']}/{r['transport']}/{r['world_size']}"
        groups.setdefault(key, []).append(
            (r["collective"], model_algorithm(r), r["bytes"], r["world_size"], r["time_us"]["median"] * 1e-6))
    out = {}
    for key, samples in sorted(groups.items()):
        backend, transport, P = key.split("/")
        p = fit(samples)
        p.update({"backend": backend, "transport": transport, "world_size": int(P)})
        out[key] = p
    return out


def describe(params: dict) -> str:
    """'alpha 2.1 us, beta 0.25 ns/B (4.0 GB/s), gamma 0.10 ns/B (10 GB/s)'."""
    def bw(x):
        return f"{1 / x / 1e9:.2f} GB/s" if x > 0 else "inf"
    return (f"alpha {params['alpha'] * 1e6:.2f} us, beta {params['beta'] * 1e9:.4f} ns/B ({bw(params['beta'])}), "
            f"gamma {params['gamma'] * 1e9:.4f} ns/B ({bw(params['gamma'])})")


def best_by_model(params, collective, algorithms, n, P):
    return min(algorithms, key=lambda a: predict(params, collective, a, n, P))


def crossovers(params, collective, algorithms, P, lo=1, hi=1 << 30, points=400):
    """[(bytes, from_algorithm, to_algorithm)] where the model's best algorithm changes."""
    if not algorithms:
        return []
    grid = np.unique(np.geomspace(lo, hi, points).astype(np.int64))
    out, prev = [], None
    for n in grid:
        best = best_by_model(params, collective, algorithms, float(n), P)
        if prev is not None and best != prev:
            out.append((int(n), prev, best))
        prev = best
    return out
