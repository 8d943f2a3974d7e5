"""A stream engine may outlive its communicator (its works hold it): dropping a communicator
without close() while calls are queued on its streams must neither crash nor hang the process. The
C++ communicator closes its engines (drains their calls, stops their watchdogs) before its
transport goes; before, the watchdog and the stream's host functions read the destroyed transport
(a segfault). Each rank is a fresh interpreter (engine_lifetime_rank.py): its exit status counts."""
import os
import subprocess
import sys

import pytest

from commlib.bootstrap.store import StoreServer

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))


@pytest.mark.timeout(90)
def test_communicator_dropped_with_queued_work_exits_cleanly():
    server = StoreServer("127.0.0.1", 0)
    procs = []
    # Slow data operations (2 ms each): the calls are still queued when the communicator goes.
    env = dict(os.environ, COMMLIB_EMULATED_DELAY_US="2000",
               PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    try:
        procs = [subprocess.Popen([sys.executable, os.path.join(HERE, "engine_lifetime_rank.py"), str(r),
                                   str(server.port)], cwd=ROOT, env=env, stdout=subprocess.PIPE,
                                  stderr=subprocess.PIPE, text=True) for r in range(2)]
        outs = [p.communicate(timeout=60) for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
        server.close()
    # Every rank's status first: a rank that crashed makes its peer fail too, naming it as gone.
    codes = {rank: p.returncode for rank, p in enumerate(procs)}
    for rank, (p, (out, err)) in sorted(enumerate(zip(procs, outs)), key=lambda e: e[1][0].returncode >= 0):
        assert p.returncode == 0, f"rank {rank} exited with {p.returncode} (negative: that signal; all: {codes})\n{err[-6000:]}"
        assert out.split()[:1] == ["ok"], f"rank {rank}: {out}\n{err[-3000:]}"
