"""Issue #40 item 3: the store survives rank 0.

With plain ``commlib.init()`` rank 0's process serves the store, so rank 0's death takes the store
with it: every survivor's shrink now raises StoreLostError saying so and how to run the job so it
does not (before: a bare "connection lost ... expected a commlib store"). With the store served
by a ``commlib store`` process (COMMLIB_STORE), the survivors of rank 0 shrink and go on.
"""
import os
import signal
import socket
import subprocess
import sys
import threading

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
if HERE not in sys.path:
    sys.path.insert(0, HERE)

import commlib  # noqa: E402
import rank0_store_cases as cases  # noqa: E402
from commlib.bootstrap.secret import sign_value, store_key  # noqa: E402
from commlib.bootstrap.store import TCPStore  # noqa: E402
from commlib.bootstrap.store_wire import HELLO_REPLY, frames  # noqa: E402
from commlib.testing.faults import run_killing_one_rank  # noqa: E402

SECRET = "rank0-store-test-secret-0123456789"
PACKAGE_PARENT = os.path.dirname(os.path.dirname(commlib.__file__))


class StoreProcess:
    """``commlib store --port 0`` in its own process; ``address`` is the host:port it printed."""

    def __init__(self, env=None):
        self.proc = subprocess.Popen([sys.executable, "-m", "commlib", "store", "--port", "0"],
                                     stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                     env={**os.environ, "PYTHONPATH": PACKAGE_PARENT, **(env or {})})
        self.banner = self.proc.stdout.readline()
        assert "serving on" in self.banner, self.banner + self.proc.stderr.read()
        self.address = self.banner.rsplit("COMMLIB_STORE=", 1)[1].strip()
        self.host, port = self.address.rsplit(":", 1)
        self.port = int(port)

    def stop(self, sig) -> tuple:
        """Send ``sig``; (exit code, the rest of stdout, stderr) once it exited."""
        self.proc.send_signal(sig)
        out, err = self.proc.communicate(timeout=20)
        return self.proc.returncode, out, err

    def kill(self):
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.communicate(timeout=20)


@pytest.mark.timeout(120)
def test_rank0s_store_dies_with_it_and_says_how_to_avoid_that():
    results = run_killing_one_rank(3, 0, cases.case_rank0_store, timeout=90)
    assert results[0] is None
    for rank in (1, 2):
        cls, msg, took = results[rank]
        assert cls == "StoreLostError", (rank, cls, msg)
        assert "served in rank 0's process" in msg and "rank 0 died" in msg, msg
        assert "commlib store" in msg and "COMMLIB_STORE" in msg, msg
        assert took < 20, (rank, took)  # the lost connection is seen at once, not at the timeout


@pytest.mark.timeout(120)
def test_survivors_of_rank0_shrink_and_go_on_under_commlib_store():
    store = StoreProcess({"COMMLIB_SECRET": SECRET})
    try:
        results = run_killing_one_rank(3, 0, cases.case_external_store, timeout=90,
                                       args=(store.address, SECRET))
        assert results[0] is None
        assert results[1] == ((0, 2), 12, (1, 1))  # 1 + 2, doubled twice; the split reversed the ranks
        assert results[2] == ((1, 2), 12, (0, 1))
        assert store.proc.poll() is None  # the store outlived rank 0
        code, out, err = store.stop(signal.SIGTERM)
    finally:
        store.kill()
    assert code == 0 and "stopped (SIGTERM)" in out, (code, out, err)


def _threads_taking(pid, sig):
    """The threads of process ``pid`` other than its main one that do not block ``sig``."""
    taking = []
    for tid in sorted(int(t) for t in os.listdir(f"/proc/{pid}/task")):
        if tid == pid:
            continue
        with open(f"/proc/{pid}/task/{tid}/status") as f:
            blocked = next(int(line.split()[1], 16) for line in f if line.startswith("SigBlk:"))
        if not blocked & (1 << (sig - 1)):
            taking.append(tid)
    return taking


@pytest.mark.timeout(60)
def test_commlib_store_stops_on_a_sigint_another_thread_takes():
    """The threads commlib's imports start do not block SIGINT; the kernel may hand a SIGINT sent to
    the process to one of them (CI once saw a KeyboardInterrupt while the store printed its start
    line). Sent to such a thread directly, it still stops the store cleanly: the signal is
    recorded by a handler, not raised, and not lost to a sigwait in the main thread."""
    import ctypes
    store = StoreProcess()
    try:
        taking = _threads_taking(store.proc.pid, signal.SIGINT)
        if not taking:
            pytest.skip("no thread of this store process leaves SIGINT unblocked (nothing to send it to)")
        libc = ctypes.CDLL(None, use_errno=True)
        assert libc.tgkill(store.proc.pid, taking[0], int(signal.SIGINT)) == 0, ctypes.get_errno()
        out, err = store.proc.communicate(timeout=20)
        code = store.proc.returncode
    finally:
        store.kill()
    assert code == 0 and "stopped (SIGINT)" in out and not err, (code, out, err)


@pytest.mark.timeout(60)
def test_commlib_store_signs_like_rank0s_and_stops_on_sigint():
    store = StoreProcess({"COMMLIB_SECRET": SECRET})
    try:
        assert "values signed with COMMLIB_SECRET only" in store.banner
        client = TCPStore(store.host, store.port, timeout=10)
        with pytest.raises(commlib.RendezvousError, match="not signed"):
            client.set("k", b"forged")
        key = store_key({"COMMLIB_SECRET": SECRET})
        client.set("k", sign_value(key, b"k", b"v"))
        assert client.get("k") == sign_value(key, b"k", b"v")
        client.close()
        code, out, err = store.stop(signal.SIGINT)
    finally:
        store.kill()
    assert code == 0 and "stopped (SIGINT)" in out and not err, (code, out, err)


def test_commlib_store_setting_is_checked(monkeypatch):
    monkeypatch.setenv("COMMLIB_STORE", "nowhere")
    with pytest.raises(ValueError, match="COMMLIB_STORE: expected host:port"):
        commlib.init(rank=0, world_size=1)


def test_silent_rank0_store_says_it_may_have_died_with_rank0():
    """A host that vanishes closes nothing: a store that rank 0 served and that no longer answers
    names rank 0 too (after the client's timeout)."""
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(1)
        held = []

        def answer_hello_then_go_silent():
            conn, _ = listener.accept()
            conn.recv(64)
            conn.sendall(frames(HELLO_REPLY))
            held.append(conn)
        t = threading.Thread(target=answer_hello_then_go_silent)
        t.start()
        client = TCPStore("127.0.0.1", listener.getsockname()[1], timeout=0.3, served_by_rank0=True)
        t.join(10)
        try:
            with pytest.raises(commlib.RendezvousError, match=r"no answer to set .*served in rank 0's process: if "
                                                              r"rank 0 \(or its host\) died.*COMMLIB_STORE"):
                client.set("k", b"v")
        finally:
            client.close()
            for c in held:
                c.close()
