"""A synthetic bench JSON (times from the cost model with known parameters) for the bench tests."""
from commlib.perf import common as C
from commlib.perf import model as M

ALGOS = {
    "all_reduce": ["ring", "recursive_doubling", "rabenseifner", "direct"],
    "all_gather": ["ring", "recursive_doubling", "bruck"],
    "reduce_scatter": ["ring", "recursive_halving"],
    "all_to_all": ["pairwise", "bruck"],
    "broadcast": ["binomial", "scatter_allgather", "pipeline"],
}
PARAMS = {"commlib": dict(alpha=2e-6, beta=2.5e-10, gamma=1e-10),
          "gloo": dict(alpha=2e-4, beta=1e-9, gamma=3e-10),
          "mpi": dict(alpha=2.5e-6, beta=3e-10, gamma=1e-10)}


def record(backend, coll, alg, mode, size, P, seconds, resolved=None, wrong=0):
    algbw, busbw = C.bandwidths(coll, size, P, seconds)
    us = seconds * 1e6
    return {"backend": backend, "transport": "shm" if backend != "gloo" else "tcp", "collective": coll,
            "algorithm": alg, "resolved": resolved or alg, "mode": mode, "world_size": P,
            "dtype": "float32", "op": "sum", "root": 0 if coll in C.ROOTED else -1, "bytes": size,
            "count": size // 4, "iters": 5, "warmup": 1,
            "time_us": {"median": us, "min": us * 0.9, "max": us * 1.3, "loop_avg": us * 1.05},
            "algbw_GBps": algbw, "busbw_GBps": busbw, "wrong": wrong, "cpu_us": us * P * 0.9,
            "switches": {"voluntary": 0.5, "involuntary": 2.0}}


def data(P=4, sizes=(8, 1024, 65536, 1 << 20), collectives=tuple(ALGOS), mpi=True):
    res = []
    for coll in collectives:
        for size in sizes:
            size = C.geometry(coll, size, "float32", P)[2]
            times = {}
            for alg in ALGOS[coll]:
                t = M.predict(PARAMS["commlib"], coll, alg, size, P)
                times[alg] = t
                for mode in ("out", "in"):
                    if coll == "broadcast" and mode == "out":
                        continue
                    res.append(record("commlib", coll, alg, mode, size, P, t))
            best = min(times, key=times.get)
            res.append(record("commlib", coll, "auto", C.COMPARE_MODE[coll], size, P, times[best], best))
            for peer in ("gloo", "mpi") if mpi else ("gloo",):
                t = M.predict(PARAMS[peer], coll, M.PEER_ALGORITHM[coll], size, P)
                res.append(record(peer, coll, peer, C.COMPARE_MODE[coll], size, P, t))
    backends = {"commlib": {"available": True, "transport": "shm", "wrong": 0},
                "gloo": {"available": True, "transport": "tcp", "library": "gloo (torch x)"},
                "mpi": ({"available": True, "transport": "shm", "library": "Open MPI v4.1.4"} if mpi else
                        {"available": False, "reason": "mpi4py not importable (synthetic)"})}
    return {"schema": "commlib-bench/1", "command": "commlib bench (synthetic)",
            "machine": C.machine_info(), "config": {"dtype": "float32", "op": "sum", "iters": 5, "warmup": 1,
                                                    "sizes": list(sizes), "collectives": list(collectives)},
            "world_size": P, "timing": "synthetic", "backends": backends, "results": res,
            "memcpy": [{"bytes": s, "time_us": {"median": s / 12e3, "min": 0, "max": 0}, "GBps": 12.0}
                       for s in sizes],
            "model": M.fit_results(res)}
