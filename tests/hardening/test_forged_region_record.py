"""Row 1: a forged `<prefix>/shm` record must never make a rank map someone else's file.

Before: the record was `pid:fd:host`, pasted into /proc/{pid}/fd/{fd}; a record such as
`self:../../<file>:host` made every rank map the attacker's file. Now the record is strict JSON, the
descriptor comes over a Unix socket whose owner is checked (SO_PEERCRED), and the C++ core maps only
a sealed commlib memfd of our user and of the expected size.
"""
import json
import os
import socket
import tempfile
import threading
import uuid

import pytest

import commlib
import commlib._C as _C
from commlib.bootstrap.fdpass import FdServer
from commlib.bootstrap.store import StoreServer, TCPStore
from hardening_util import SecondUser


@pytest.fixture
def store():
    s = StoreServer("127.0.0.1", 0)
    yield s
    s.close()


def _rank1(store, prefix):
    # Rank 0's host record comes first (commlib.bootstrap.hosts); the forged region record follows it.
    TCPStore("127.0.0.1", store.port).set(f"{prefix}/host/0", f"2:{socket.gethostname()[:128]}")
    return commlib.init(rank=1, world_size=2, store=TCPStore("127.0.0.1", store.port, timeout=5),
                        prefix=prefix, timeout=5)


def _record(pid, sock_name):
    return json.dumps({"pid": pid, "size": 2, "host": socket.gethostname(), "socket": sock_name,
                       "bytes": _C.shm_region_bytes(2)})


def test_path_climbing_record_is_refused(store):
    with tempfile.NamedTemporaryFile() as target:
        TCPStore("127.0.0.1", store.port).set("p1/shm", f"self:../../{target.name}:{socket.gethostname()}")
        with pytest.raises(commlib.RendezvousError, match="malformed"):
            _rank1(store, "p1")


def test_descriptor_of_a_plain_file_is_refused(store):
    """A same-user process serving a regular file's descriptor: the core refuses to map it."""
    with tempfile.TemporaryFile() as f:
        f.truncate(_C.shm_region_bytes(2))
        server = FdServer(f.fileno(), 2)
        threading.Thread(target=server.serve_one, args=(10.0,), daemon=True).start()
        try:
            TCPStore("127.0.0.1", store.port).set("p2/shm", _record(os.getpid(), server.name))
            with pytest.raises(commlib.CommError, match="not a memfd sealed"):
                _rank1(store, "p2")
        finally:
            server.close()


def test_socket_of_another_process_is_refused(store):
    """The record names rank 0's pid; a socket owned by any other process is not believed."""
    fd = os.memfd_create("commlib:x")
    server = FdServer(fd, 2)
    try:
        TCPStore("127.0.0.1", store.port).set("p3/shm", _record(1, server.name))
        with pytest.raises(commlib.RendezvousError, match="not to rank 0"):
            _rank1(store, "p3")
    finally:
        server.close()
        os.close(fd)


def _serve_as(user, name: str, ready_w: int):
    """Forked child: become ``user``, then serve a region-sized sealed memfd of that user on ``name``."""
    try:
        os.setgroups([])
        os.setgid(user.gid)
        os.setuid(user.uid)
        fd = os.memfd_create("commlib:forged", os.MFD_ALLOW_SEALING)
        os.ftruncate(fd, _C.shm_region_bytes(2))
        s = socket.socket(socket.AF_UNIX)
        s.bind("\0" + name)
        s.listen(1)
        os.write(ready_w, b"r")
        s.settimeout(20)
        c, _ = s.accept()
        c.recv(4)
        socket.send_fds(c, [b"F"], [fd])
        c.close()
    finally:
        os._exit(0)


@pytest.mark.skipif(not SecondUser.available(), reason="needs root and useradd to create a second user")
def test_socket_of_another_user_is_refused(store):
    """Another local user forges the record and serves their own memfd: no rank takes it."""
    name = "commlib-" + uuid.uuid4().hex
    with SecondUser() as other:
        ready_r, ready_w = os.pipe()
        pid = os.fork()
        if pid == 0:
            _serve_as(other, name, ready_w)
        try:
            assert os.read(ready_r, 1) == b"r"
            TCPStore("127.0.0.1", store.port).set("p4/shm", _record(pid, name))
            with pytest.raises(commlib.RendezvousError, match=f"uid {other.uid}"):
                _rank1(store, "p4")
        finally:
            os.close(ready_r)
            os.close(ready_w)
            try:
                os.kill(pid, 9)
            except ProcessLookupError:
                pass
            os.waitpid(pid, 0)
