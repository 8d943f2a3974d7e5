"""One rank of test_engine_lifetime.py, run as a script: ``engine_lifetime_rank.py RANK PORT``.

The rank enqueues device all_reduces on a sub-communicator (slow emulated operations: still
queued), drops the communicator without close() but keeps the last work, collects it, then
synchronizes the work and checks its result; then it enqueues more on the world communicator and
exits without closing anything. Prints "ok <value>" when the kept work's data was right.
"""
import faulthandler
import gc
import sys

import numpy as np

import commlib
import commlib.emulated as emu
from commlib.bootstrap.store import TCPStore

CALLS = 8


def main(rank: int, port: int) -> None:
    faulthandler.enable()  # a crash shows where, on stderr (all threads)
    faulthandler.dump_traceback_later(40)  # a hang shows where, on stderr, before the test gives up
    world = commlib.init(rank=rank, world_size=2, store=TCPStore("127.0.0.1", port), timeout=60)
    sub = world.split(0)
    x = emu.from_numpy(np.ones(1 << 12, np.float32))
    works = [sub.all_reduce(x, async_op=True) for _ in range(CALLS)]
    kept = works[-1]
    del works, sub
    gc.collect()  # the communicator is gone; its engine lives on in `kept`
    kept.synchronize()
    value = float(x.numpy()[0])
    print("ok" if value == 2.0 ** CALLS else "wrong", value, flush=True)
    # Exit with calls still queued on the world communicator, which is never closed.
    global last
    last = [world.all_reduce(x, async_op=True) for _ in range(CALLS)][-1]


if __name__ == "__main__":
    main(int(sys.argv[1]), int(sys.argv[2]))
