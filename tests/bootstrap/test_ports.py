"""commlib.bootstrap.ports: rendezvous ports drawn outside the kernel's ephemeral range, so that no
bind(0) or outgoing connection elsewhere on the machine is handed the port between the pick and the
listen (CI once lost a torch TCPStore's listen to EADDRINUSE that way)."""
import socket

import pytest

from commlib.bootstrap import ports


def test_a_free_port_is_outside_the_ephemeral_range_and_bindable():
    first, last = ports.ephemeral_range()
    for _ in range(20):
        port = ports.free_port()
        assert not first <= port <= last, (port, first, last)
        with socket.socket() as s:
            s.bind(("127.0.0.1", port))  # nothing holds it


def test_a_port_in_use_is_drawn_again(monkeypatch):
    with socket.socket() as held:
        lo, hi = ports._candidates()
        for port in range(lo, hi):
            try:
                held.bind(("127.0.0.1", port))
                break
            except OSError:
                continue
        draws = iter([port, port, port + 1 if port < hi else port - 1])
        monkeypatch.setattr(ports.random.SystemRandom, "randint", lambda self, a, b: next(draws))
        got = ports.free_port()
        assert got != port and lo <= got <= hi


def test_free_ports_are_distinct():
    got = ports.free_ports(8)
    assert len(set(got)) == 8


@pytest.mark.parametrize("text,expected", [("32768\t60999\n", (10000, 32767)), ("1024 60999", (61000, 65535))])
def test_the_draw_avoids_whatever_range_the_kernel_uses(tmp_path, monkeypatch, text, expected):
    f = tmp_path / "ip_local_port_range"
    f.write_text(text)
    monkeypatch.setattr(ports, "_EPHEMERAL_RANGE_FILE", str(f))
    assert ports._candidates() == expected
