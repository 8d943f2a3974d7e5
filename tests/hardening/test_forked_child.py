"""Row 7: a forked child using its parent's communicator.

Before: the child acted as the parent's rank (a peer received the child's data, then
MismatchError). Now every call in the child raises CommError at once, and the child's close() (or
exit) leaves the parent's communicator working.
"""
import os

import numpy as np

import commlib


def fork_and_call(comm):
    sub = comm.split(0)
    try:
        if sub.rank == 0:
            r, w = os.pipe()
            pid = os.fork()
            if pid == 0:  # the child: every use must be refused, nothing sent
                os.close(r)
                outcome = []
                for name, call in (("all_reduce", lambda: sub.all_reduce(np.ones(4, np.float32))),
                                   ("barrier", lambda: sub.barrier()),
                                   ("send", lambda: sub.send(np.ones(4, np.float32), 1)),
                                   ("split", lambda: sub.split(0))):
                    try:
                        call()
                        outcome.append(f"{name}: ran")
                    except commlib.CommError as e:
                        outcome.append(f"{name}: {'forked child' in str(e)}")
                sub.close()
                os.write(w, ";".join(outcome).encode())
                os._exit(0)
            os.close(w)
            report = os.read(r, 4096).decode()
            os.close(r)
            os.waitpid(pid, 0)
        else:
            report = None
        x = np.full(8, sub.rank + 1, np.float32)
        sub.all_reduce(x)  # the parent's communicator still works on both ranks
        return report, x.tolist()
    finally:
        sub.close()


def test_child_is_refused_and_parent_unaffected(pool):
    (report, x0), (_, x1) = pool(2).run(fork_and_call, timeout=30)
    assert report == "all_reduce: True;barrier: True;send: True;split: True", report
    assert x0 == x1 == [3.0] * 8
