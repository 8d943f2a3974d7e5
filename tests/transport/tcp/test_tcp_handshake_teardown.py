"""A TCP endpoint destroyed right after its progress thread refused a handshake must not crash.

The defect (issue #27's handshake): a connection whose Hello had already arrived when the progress
thread accepted it was refused inline, its entry left empty in the handshakes-in-progress list
until the thread's next 50 ms sweep; an endpoint destroyed before that sweep read the empty entry
in its destructor (SIGSEGV, the whole process). The race is forced here: the endpoint lives in a
child process that is stopped (SIGSTOP) while the connection is made and the Hello sent, so the
kernel queues both and the progress thread meets them together when the child resumes."""
import hashlib
import os
import signal
import socket
import struct
import subprocess
import sys
import time

import pytest

from tcp_wire import MAGIC, hello
ROUNDS = 4  # without the fix the child crashed in the first or second round of every run tried

CHILD = r"""
import os, sys, time
import commlib._C as _C
for _ in range(int(sys.argv[1])):
    e = _C.TcpEndpoint(0, 2, "teardown", [False, True], 5.0)
    print(e.address, flush=True)
    while e.rejected == 0:   # the refusal is counted before it is sent
        time.sleep(0.0005)
    del e                    # at once: well inside the progress thread's 50 ms sweep
    print("destroyed", flush=True)
"""


def _stopped(pid):
    with open(f"/proc/{pid}/stat") as f:
        return f.read().rsplit(")", 1)[1].split()[0] in ("T", "t")


def _refused_hello(address, child_pid):
    """Connects and sends a Hello for a lane out of range while the child is stopped; returns the
    refusal's bytes."""
    host, port = address.rsplit(":", 1)
    cid = hashlib.sha256(b"teardown").digest()[:16]
    frame = hello(cid, os.getpid(), 512 << 10, os.urandom(32), 2, 2)  # lane 2 of 2
    os.kill(child_pid, signal.SIGSTOP)
    try:
        deadline = time.monotonic() + 5
        while not _stopped(child_pid):
            assert time.monotonic() < deadline, "the child did not stop"
        s = socket.create_connection((host, int(port)), timeout=5)
        s.sendall(frame)
    finally:
        os.kill(child_pid, signal.SIGCONT)
    with s:
        return s.recv(80, socket.MSG_WAITALL)


@pytest.mark.timeout(60)
def test_endpoint_destroyed_right_after_an_inline_refusal():
    env = {**os.environ, "COMMLIB_SOCKET_IFNAME": "lo", "COMMLIB_TCP_NCONNS": "2"}
    env.pop("COMMLIB_SECRET", None)
    child = subprocess.Popen([sys.executable, "-c", CHILD, str(ROUNDS)], stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True, env=env)
    try:
        for round_ in range(ROUNDS):
            address = child.stdout.readline().strip()
            assert address, f"round {round_}: the child ended early: {child.wait(10)}"
            refusal = _refused_hello(address, child.pid)
            assert len(refusal) == 80 and refusal[:8] != struct.pack("<Q", MAGIC)  # refused, with a reason
            line = child.stdout.readline().strip()
            assert line == "destroyed", f"round {round_}: the child died (exit {child.wait(10)}): " \
                                        f"{child.stderr.read()[-2000:]}"
        assert child.wait(30) == 0, child.stderr.read()[-2000:]
    finally:
        if child.poll() is None:
            os.kill(child.pid, signal.SIGCONT)
            child.kill()
            child.wait()
        child.stdout.close()
        child.stderr.close()
