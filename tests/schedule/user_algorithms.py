"""An algorithm defined outside the library, as a user would write one, and rank-side functions
that run it (imported by the rank processes of tests/schedule/test_user_algorithm.py).

``chain`` broadcast: the root sends the whole message to the next rank, which forwards it to the
next, and so on (P-1 hops: latency-bound, but every link carries the message once).
"""
import io

import numpy as np

import commlib


def chain_broadcast(rank, size, count, root):
    """One rank's schedule, as plain data (the format of commlib.schedule)."""
    vr = (rank - root) % size  # position along the chain
    nxt, prev = (rank + 1) % size, (rank - 1) % size
    whole_output = ("output", 0, count)
    if vr == 0:
        # Out of place the root's output needs the data too; in place this copy is a no-op.
        step = [{"op": "copy", "dst": whole_output, "src": ("input", 0, count)}]
        if size > 1:
            step.append({"op": "send", "peer": nxt, "src": ("input", 0, count)})
        return {"steps": [step]}
    steps = [[{"op": "recv", "peer": prev, "dst": whole_output}]]
    if vr < size - 1:
        steps.append([{"op": "send", "peer": nxt, "src": whole_output}])
    return {"steps": steps}


def chain_broadcast_forgetting_the_root(rank, size, count, root):
    """A bug the verifier must catch: the root never writes its own output (out of place)."""
    sched = chain_broadcast(rank, size, count, root)
    if rank == root:
        sched["steps"][0] = [op for op in sched["steps"][0] if op["op"] != "copy"]
    return sched


def chain_broadcast_out_of_bounds(rank, size, count, root):
    """A schedule reaching one element past the output on every rank: refused before it runs
    (every rank refuses, so nothing is sent and the communicator stays usable)."""
    sched = chain_broadcast(rank, size, count, root)
    if count:
        sched["steps"][0][0]["dst"] = ("output", 1, count)
    return sched


def register(suffix=""):
    """Register the algorithms (every rank, same order). Idempotent per process."""
    for name, fn in (("chain", chain_broadcast), ("chain_oob", chain_broadcast_out_of_bounds)):
        if name + suffix not in commlib.algorithms("broadcast"):
            commlib.register_algorithm("broadcast", name + suffix, fn, summary="P-1 hops down a chain")


# -- rank side ------------------------------------------------------------------------------------
def run_chain(comm, count, root, dtype):
    register()
    x = np.full(count, -1, dtype) if comm.rank != root else np.arange(count).astype(dtype)
    comm.broadcast(x, root=root, algorithm="chain")  # blocking (fast path falls back: new name)
    y = np.full(count, -1, dtype) if comm.rank != root else np.arange(count).astype(dtype) + 1
    comm.broadcast(y, root=root, algorithm="chain", async_op=True).wait()
    return x.tolist(), y.tolist()


def run_out_of_bounds(comm):
    register()
    x = np.zeros(8, np.float32)
    try:
        comm.broadcast(x, root=0, algorithm="chain_oob")
    except ValueError as e:
        return str(e)
    return None


def bench_chain(comm):
    """The bench's sweep engine, as commlib bench runs it, on the registered algorithm (brought in
    the way `commlib bench --import user_algorithm_plugin` brings it into every rank)."""
    from commlib.bench.launcher import import_plugins
    from commlib.bench.backends import CommlibBackend
    from commlib.bench.sweep import Sweep
    import_plugins({"imports": ["user_algorithm_plugin"]})
    assert "chain" in commlib.algorithms("broadcast")
    cfg = {"collectives": ["broadcast"], "sizes": [8, 4096], "dtype": "float32", "op": "sum", "root": 1,
           "iters": 3, "min_time": 0, "max_iters": 3, "warmup": 1, "check": True, "rounds": 1,
           "modes": ["in"], "algorithms": ["chain", "binomial"], "peers": []}
    sweep = Sweep(CommlibBackend(comm), cfg, out=io.StringIO())
    records = sweep.run()
    return [(r["algorithm"], r["bytes"], r["wrong"]) for r in records], sweep.wrong_total
