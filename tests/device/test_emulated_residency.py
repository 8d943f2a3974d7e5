"""The emulated device's resident blocks are the device's, not a process's (issue #38, item 4;
csrc/device/emulated/emulated_residency.h), as a GPU's SMs are shared by every process using it:
with COMMLIB_EMULATED_RESIDENT_BLOCKS=2, a process holding both places keeps another process's
block waiting; killed (SIGKILL: it gives nothing back), its places are reclaimed, the waiting
block runs, and once it leaves no ledger is left in /dev/shm. Two real processes besides pytest."""
import os
import signal
import subprocess
import sys
import uuid

import pytest

import commlib._C as _C

DEVICE = 80
HOLDER = """
import sys
import commlib._C as _C, commlib.emulated as emu
d = emu.device(int(sys.argv[1]))
_C.emulated_enter_resident(d)
_C.emulated_enter_resident(d)
print("held", flush=True)
sys.stdin.readline()
"""
WAITER = """
import sys, threading
import commlib._C as _C, commlib.emulated as emu
d = emu.device(int(sys.argv[1]))
entered = threading.Event()
threading.Thread(target=lambda: (_C.emulated_enter_resident(d), entered.set()), daemon=True).start()
print("entered early" if entered.wait(1.0) else "waiting", flush=True)
sys.stdin.readline()
print("entered" if entered.wait(60) else "still waiting", emu.residency(int(sys.argv[1]))[2], flush=True)
_C.emulated_leave_resident(d)
ledger = emu.residency(int(sys.argv[1]))[0]
print("left", _C.shared_ledger_exists(ledger), ledger, flush=True)
"""


def _start(script, env):
    return subprocess.Popen([sys.executable, "-c", script, str(DEVICE)], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, text=True, env=env)


@pytest.mark.timeout(120)
def test_places_are_shared_across_processes_and_a_dead_holders_are_reclaimed():
    env = dict(os.environ, COMMLIB_EMULATED_RESIDENT_BLOCKS="2",
               COMMLIB_EMULATED_MACHINE=f"res{uuid.uuid4().hex[:12]}")
    holder = _start(HOLDER, env)
    waiter = None
    try:
        assert holder.stdout.readline().strip() == "held"
        waiter = _start(WAITER, env)
        assert waiter.stdout.readline().strip() == "waiting"  # the device is full: the holder's places
        holder.send_signal(signal.SIGKILL)
        holder.wait(timeout=30)
        waiter.stdin.write("go\n")
        waiter.stdin.flush()
        assert waiter.stdout.readline().split() == ["entered", "2"]  # the dead holder's two places
        state, exists, ledger = waiter.stdout.readline().split()
        assert (state, exists) == ("left", "False")
        assert waiter.wait(timeout=30) == 0
        assert not _C.shared_ledger_exists(ledger)
    finally:
        for p in (holder, waiter):
            if p is not None and p.poll() is None:
                p.kill()
                p.wait()
