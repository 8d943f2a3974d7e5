"""commlib's store spoken from C++ (csrc/bootstrap/store_client.h, signed_values.h; the set-up's
adapter bindings/commlib_setup_store.h, seen through its test seam ``_C.CommlibSetupStore``): the
same values as the Python store (commlib/bootstrap/store.py TCPStore, secret.py SignedStore), the
same signatures byte for byte, and the same failures under the same classes and texts: a tampered
or unsigned value, a refused write, a server gone, a server that stays silent."""
import socket
import threading

import pytest

import commlib
from commlib import _C
from commlib.bootstrap import secret
from commlib.bootstrap.store import StoreServer, TCPStore
from commlib.bootstrap.store_wire import HELLO_REPLY, frames

SECRET = b"0123456789abcdef0123456789abcdef"
KEY = secret.derive_key(SECRET, "store")


@pytest.fixture
def server():
    s = StoreServer("127.0.0.1", 0)
    yield s
    s.close()


@pytest.fixture
def stores(server):
    """(Python TCPStore, its C++ set-up store), both closed after the test."""
    py = TCPStore("127.0.0.1", server.port, timeout=5)
    cpp = _C.CommlibSetupStore.of(py)
    yield py, cpp
    cpp.idle()
    py.close()


def _raised(fn):
    """(class name, message) of what fn() raised."""
    with pytest.raises(commlib.RendezvousError) as e:
        fn()
    return type(e.value).__name__, str(e.value)


def test_only_commlibs_own_store_is_read_from_cpp(server):
    py = TCPStore("127.0.0.1", server.port)
    try:
        assert _C.CommlibSetupStore.of(py) is not None
        assert _C.CommlibSetupStore.of(secret.SignedStore(py, KEY)) is not None

        class Mine(TCPStore):  # a subclass may do what it likes in set/get: its Python object is called
            pass
        assert _C.CommlibSetupStore.of(object()) is None
        assert _C.CommlibSetupStore.of(secret.SignedStore(object(), KEY)) is None
        sub = Mine("127.0.0.1", server.port)
        assert _C.CommlibSetupStore.of(sub) is None
        sub.close()
        closed = TCPStore("127.0.0.1", server.port)
        closed.close()  # its own operations raise: the set-up keeps calling them
        assert _C.CommlibSetupStore.of(closed) is None
    finally:
        py.close()


def test_values_go_both_ways(stores):
    py, cpp = stores
    assert cpp.try_get("k") is None
    cpp.set("k", b"\x00from c++\xff")
    assert py.get("k") == b"\x00from c++\xff" and py.check(["k"])
    py.set("j", b"from python")
    assert cpp.try_get("j") == b"from python"
    cpp.set("empty", b"")
    assert cpp.try_get("empty") == b"" and py.get("empty") == b""


def test_signatures_are_byte_exact_both_ways(stores):
    for name, value in ((b"pool/device1/0", b"handle"), (b"", b""), (b"k\xc3\xa9y", bytes(range(256)) * 9)):
        signed = _C.sign_store_value(KEY, name, value)
        assert signed == secret.sign_value(KEY, name, value)
        assert secret.verify_value(KEY, name, signed) == value
        assert _C.verify_store_value(KEY, name, secret.sign_value(KEY, name, value)) == value
    py, _ = stores
    signed_py = secret.SignedStore(py, KEY)
    signed_cpp = _C.CommlibSetupStore.of(signed_py)
    try:
        signed_cpp.set("a", b"signed in C++")
        assert signed_py.get("a") == b"signed in C++"  # verified by Python
        assert py.get("a") == secret.sign_value(KEY, b"a", b"signed in C++")  # the bytes Python would store
        signed_py.set("b", b"signed in Python")
        assert signed_cpp.try_get("b") == b"signed in Python"  # verified by C++
    finally:
        signed_cpp.idle()


@pytest.mark.parametrize("stored", [
    pytest.param(lambda: secret.sign_value(KEY, b"x", b"value")[:-1] + b"W", id="tampered-value"),
    pytest.param(lambda: secret.sign_value(KEY, b"another key", b"value"), id="replayed-under-another-key"),
    pytest.param(lambda: secret.sign_value(secret.derive_key(b"another secret, long enough", "store"), b"x",
                                           b"value"), id="another-secret"),
    pytest.param(lambda: b"value", id="unsigned"),
    pytest.param(lambda: b"CLS1short", id="truncated"),
])
def test_a_bad_value_is_refused_from_cpp_as_python_refuses_it(stores, stored):
    py, _ = stores
    py.set("x", stored())
    signed_py = secret.SignedStore(py, KEY)
    signed_cpp = _C.CommlibSetupStore.of(signed_py)
    try:
        expected = _raised(lambda: signed_py.get("x"))
        assert _raised(lambda: signed_cpp.try_get("x")) == expected
        assert expected[0] == "RendezvousError"
    finally:
        signed_cpp.idle()


def test_a_refused_write_says_what_python_says(monkeypatch):
    keyed = StoreServer("127.0.0.1", 0, key=KEY)  # refuses values not signed for their key
    py = TCPStore("127.0.0.1", keyed.port)
    cpp = _C.CommlibSetupStore.of(py)  # unsigned: the server refuses its writes
    try:
        assert _raised(lambda: cpp.set("k", b"v")) == _raised(lambda: py.set("k", b"v"))
        signed = _C.CommlibSetupStore.of(secret.SignedStore(py, KEY))
        signed.set("k", b"v")  # signed in C++: the server's Python check accepts it
        assert secret.SignedStore(py, KEY).get("k") == b"v"
        signed.idle()
    finally:
        cpp.idle()
        py.close()
        keyed.close()


@pytest.mark.parametrize("rank0", [False, True])
def test_a_server_gone_is_the_same_store_lost_error(rank0):
    server = StoreServer("127.0.0.1", 0)
    py = TCPStore("127.0.0.1", server.port, timeout=5, served_by_rank0=rank0)
    # Python stores whose first operation comes after the server went (a set, a check)
    idle = [TCPStore("127.0.0.1", server.port, timeout=5, served_by_rank0=rank0) for _ in range(2)]
    cpp = _C.CommlibSetupStore.of(py)
    try:
        assert cpp.try_get("first") is None  # (its connection is open, as during a set-up)
        server.close()
        got = _raised(lambda: cpp.try_get("pool/device1/1"))
        assert got == _raised(lambda: py.check(["pool/device1/1"]))
        assert got[0] == "StoreLostError" and ("rank 0 died" in got[1]) == rank0, got
        # A set-up that starts after the server went opens its connection then, and is refused: the
        # same event as the Python store's open connection closed by the server, and the same text
        # ("store connection closed", not the connect's "[Errno 111] Connection refused").
        cpp.idle()
        expected = _raised(lambda: idle[0].set("pool/device2/0", b"h"))
        assert expected == ("StoreLostError", f"store at 127.0.0.1:{server.port}: connection lost during set "
                                              f"'pool/device2/0' (store connection closed): "
                                              f"{got[1].split('): ', 1)[1]}"), expected
        assert _raised(lambda: cpp.set("pool/device2/0", b"h")) == expected
        cpp.idle()
        assert _raised(lambda: cpp.try_get("pool/device2/1")) == _raised(lambda: idle[1].check(["pool/device2/1"]))
    finally:
        cpp.idle()
        for store in [py] + idle:
            store.close()
        server.close()


@pytest.mark.timeout(30)
@pytest.mark.parametrize("rank0", [False, True])
def test_a_silent_server_times_out_as_before(rank0):
    """A server that answers the hello and then nothing: after the store's timeout, the same
    RendezvousError as the Python store's (never a hang)."""
    listener = socket.create_server(("127.0.0.1", 0))
    conns, stop = [], threading.Event()

    def serve():  # hello on every connection, then silence
        listener.settimeout(0.05)
        while not stop.is_set():
            try:
                c, _ = listener.accept()
            except socket.timeout:
                continue
            c.recv(64)
            c.sendall(frames(HELLO_REPLY))
            conns.append(c)
    t = threading.Thread(target=serve, daemon=True)
    t.start()
    py = TCPStore("127.0.0.1", listener.getsockname()[1], timeout=0.4, served_by_rank0=rank0)
    cpp = _C.CommlibSetupStore.of(py)
    try:
        got = _raised(lambda: cpp.try_get("pool/device1/1"))
        assert got == _raised(lambda: py.check(["pool/device1/1"]))
        assert got[0] == "RendezvousError" and "no answer to check 'pool/device1/1' within 0.4 s" in got[1], got
        got = _raised(lambda: cpp.set("k", b"v"))
        assert got == _raised(lambda: py.set("k", b"v")), got
    finally:
        cpp.idle()
        py.close()
        stop.set()
        t.join(5)
        for c in conns:
            c.close()
        listener.close()
