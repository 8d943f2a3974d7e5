"""Growing back, timed: kill → shrink → a replacement joins → first step at full size, against a
full restart measured in the same run (issue #40, item 5; run by ``bench/fault_recovery.py
--grow``, whose docstring and bench/RESULTS_fault.md say what each column is).

Every run is a fresh pool of ``size`` rank processes (commlib.testing.RankPool) training a torch
MLP under ``commlib.parallel.DataParallel`` with SGD and momentum. Rank 0 saves a checkpoint (the
model and optimizer state: what a restart would load); the last rank SIGKILLs itself; the
survivors shrink and take one step; rank 0 then starts a replacement, a brand-new Python process
(``python bench/grow_recovery.py joiner ...``), and the survivors call ``DataParallel.grow``. The
replacement imports torch and commlib, builds the model, calls ``commlib.join`` and
``DataParallel.joined`` (rank 0's parameters and optimizer state over the wire) and takes its
first step with the others. Then, as the peer, rank 0 starts another brand-new process (``...
restart ...``) that does what each process of a restarted job does: imports torch and commlib,
builds the model, loads the checkpoint, runs a rendezvous (a 1-rank ``commlib.init``) and takes
one step.
"""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

HERE = os.path.abspath(__file__)
ROOT = os.path.dirname(os.path.dirname(HERE))
WIDTH, LAYERS = 1024, 4  # 4 Mi parameters, 16 MiB of float32 (and as much momentum)
STEPS_BEFORE = 3


def _model():
    import torch
    torch.manual_seed(0)
    layers = []
    for _ in range(LAYERS):
        layers += [torch.nn.Linear(WIDTH, WIDTH), torch.nn.Tanh()]
    model = torch.nn.Sequential(*layers)
    return model, torch.optim.SGD(model.parameters(), lr=1e-3, momentum=0.9)


def _step(model, opt):
    import torch
    opt.zero_grad()
    model(torch.ones(8, WIDTH)).square().mean().backward()
    opt.step()


def _spawn(role, *args):
    env = dict(os.environ, PYTHONPATH=ROOT, OMP_NUM_THREADS="1")
    return subprocess.Popen([sys.executable, HERE, role, *map(str, args)], env=env, stdout=subprocess.PIPE, text=True)


def rank_main(comm, victim, port, ckpt):
    """One run on one rank of the pool (module-level: the pool imports it by name). Returns
    rank 0's times in seconds: (kill → first step on the shrunk group, the replacement's start →
    its first step at full size, of which from its model built on (join, state, step), the
    restart's start → its first step, of which from its model built on (checkpoint load,
    rendezvous, step)), else None."""
    import torch

    import commlib
    from commlib.bootstrap.store import TCPStore
    from commlib.errors import PeerError
    from commlib.parallel import DataParallel
    torch.set_num_threads(1)
    store = TCPStore("127.0.0.1", port)
    c = commlib.init(rank=comm.rank, world_size=comm.size, store=store, prefix="bench_grow")
    model, opt = _model()
    dp = DataParallel(model, c)
    for _ in range(STEPS_BEFORE):
        _step(dp, opt)
    if c.rank == 0:
        torch.save({"model": model.state_dict(), "optimizer": opt.state_dict()}, ckpt)
    c.barrier()
    if c.rank == victim:
        store.set("bench_grow/kill", repr(time.time()))
        os.kill(os.getpid(), signal.SIGKILL)
    try:
        _step(dp, opt)
        raise AssertionError("the step after the kill completed")
    except PeerError:
        dp.shrink()
    _step(dp, opt)
    t_shrunk = time.time()
    joiner = _spawn("joiner", port) if dp.comm.rank == 0 else None
    t_spawn = time.time()
    dp.grow(1, timeout=300, optimizer=opt)
    _step(dp, opt)
    out = None
    if dp.comm.rank == 0:
        j_built, j_first = map(float, joiner.communicate(timeout=300)[0].split()[-2:])
        restart = _spawn("restart", ckpt)
        t_restart_spawn = time.time()
        r_built, r_first = map(float, restart.communicate(timeout=300)[0].split()[-2:])
        t_kill = float(bytes(store.get("bench_grow/kill")))
        out = (t_shrunk - t_kill, j_first - t_spawn, j_first - j_built, r_first - t_restart_spawn, r_first - r_built)
    dp.comm.close()
    store.close()
    return out


def joiner_main(port):
    import commlib
    from commlib.parallel import DataParallel
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    model, opt = _model()
    t_built = time.time()
    comm = commlib.join(prefix="bench_grow", timeout=300)
    dp = DataParallel.joined(model, comm, optimizer=opt)
    _step(dp, opt)
    print(t_built, time.time(), flush=True)
    comm.close()


def restart_main(ckpt):
    import torch

    import commlib
    model, opt = _model()
    t_built = time.time()
    state = torch.load(ckpt, weights_only=True)
    model.load_state_dict(state["model"])
    opt.load_state_dict(state["optimizer"])
    comm = commlib.init(rank=0, world_size=1, prefix="bench_restart")
    from commlib.parallel import DataParallel
    _step(DataParallel(model, comm), opt)
    print(t_built, time.time(), flush=True)
    comm.close()


def one_run(size, tmpdir):
    from commlib.testing import RankPool
    pool = RankPool(size, timeout=300)
    try:
        res = pool.run(rank_main, size - 1, pool.store.port, os.path.join(tmpdir, "ckpt.pt"),
                       allow_death=True, timeout=300)
    finally:
        pool.kill()
    return res[0]


if __name__ == "__main__":
    {"joiner": lambda: joiner_main(int(sys.argv[2])), "restart": lambda: restart_main(sys.argv[2])}[sys.argv[1]]()
