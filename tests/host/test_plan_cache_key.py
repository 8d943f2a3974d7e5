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
