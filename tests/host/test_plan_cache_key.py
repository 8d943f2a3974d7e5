"""The plan cache keys a call by its element size too (plan/call.h ScheduleKey): auto chooses by
bytes, so two calls of the same count in dtypes of different sizes must not share a cached choice."""
import subprocess
import sys

from commlib.testing.ranks import PACKAGE_PARENT

CODE = """
import numpy as np, commlib
from commlib import _C
# auto's table for one rank: up to 16 bytes ring, above that direct.
_C.set_tuning(_C.Collective.all_reduce, [(1, 16, "ring"), (1, -1, "direct")])
c = commlib.init(rank=0, world_size=1, master_port=0)
small = np.ones(16, np.int8)      # 16 bytes
large = np.ones(16, np.float64)   # the same count, 128 bytes
c.all_reduce(small); c.all_reduce(large); c.all_reduce(small)
assert (small == 1).all() and (large == 1).all()
c.close()
"""


def test_same_count_other_element_size_gets_its_own_auto_choice():
    import os
    env = dict(os.environ, COMMLIB_DEBUG="TRACE", COMMLIB_TUNING="0", PYTHONPATH=PACKAGE_PARENT)
    env.pop("COMMLIB_ALGO_ALL_REDUCE", None)
    out = subprocess.run([sys.executable, "-c", CODE], env=env, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    calls = [line for line in out.stderr.splitlines() if "TRACE" in line and "all_reduce #" in line]
    assert len(calls) == 3, out.stderr
    assert "(ring, 16 x int8" in calls[0], calls
    assert "(direct, 16 x float64" in calls[1], calls  # was ring: the int8 call's cached plan
    assert "(ring, 16 x int8" in calls[2], calls


REREGISTERED = """
import numpy as np, commlib
def once(rank, size, count, root):
    return {"steps": [[{"op": "copy", "dst": ("output", 0, count), "src": ("input", 0, count)}]], "scratch_count": 0}
def twice(rank, size, count, root):
    return {"steps": [[{"op": "copy", "dst": ("output", 0, count), "src": ("input", 0, count)}],
                      [{"op": "reduce", "dst": ("output", 0, count), "src": ("input", 0, count)}]], "scratch_count": 0}
c = commlib.init(rank=0, world_size=1, master_port=0)
x = np.arange(8, dtype=np.int32)
commlib.register_algorithm("all_reduce", "once", once)
out = np.zeros(8, np.int32); c.all_reduce(x, out=out, algorithm="once"); assert (out == x).all(), out
commlib.unregister_algorithm("all_reduce", "once")
commlib.register_algorithm("all_reduce", "twice", twice)  # takes the index "once" had
out = np.zeros(8, np.int32); c.all_reduce(x, out=out, algorithm="twice")
assert (out == 2 * x).all(), f"ran the unregistered algorithm's cached plan: {out}"
commlib.unregister_algorithm("all_reduce", "twice")
c.close()
"""


def test_an_algorithm_registered_in_a_removed_ones_index_gets_its_own_plan():
    """The key holds the algorithm's index, which a Python algorithm registered after another was
    unregistered takes over: the cache is dropped when the registry changes (session 27: the laned
    tests' list-order twins ran another algorithm's cached schedule)."""
    import os
    env = dict(os.environ, PYTHONPATH=PACKAGE_PARENT)
    out = subprocess.run([sys.executable, "-c", REREGISTERED], env=env, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
