"""all_to_all direct's peer order (csrc/schedule/all_to_all.cc): the host executor takes a step's
messages in op order, so rank r's k-th send goes to r+k and its k-th receive comes from r-k; then at
every position k each rank's buffer has exactly one reader (single-copy reads of one peer's buffer by
all P-1 readers at once, rank 0's first, is what the rotation avoids). Nothing else changes: one step,
the own block copied, every block sent and received once."""
import pytest

from commlib.core import schedules


def _messages(P, r, n=3):
    (step,) = schedules.schedule("all_to_all", "direct", rank=r, size=P, count=n)["steps"]
    copies = [op for op in step if op["op"] == "copy"]
    sends = [op for op in step if op["op"] == "send"]
    recvs = [op for op in step if op["op"] == "recv"]
    assert copies == [{"op": "copy", "peer": None, "dst": ("output", r * n, n), "src": ("input", r * n, n)}]
    assert len(sends) + len(recvs) + 1 == len(step)
    for op in sends:
        assert op["src"] == ("input", op["peer"] * n, n)
    for op in recvs:
        assert op["dst"] == ("output", op["peer"] * n, n)
    return [op["peer"] for op in sends], [op["peer"] for op in recvs]


@pytest.mark.parametrize("P", [1, 2, 3, 4, 5, 8])
def test_direct_visits_peers_in_rotated_order(P):
    for r in range(P):
        to, frm = _messages(P, r)
        assert to == [(r + k) % P for k in range(1, P)]
        assert frm == [(r - k) % P for k in range(1, P)]


@pytest.mark.parametrize("P", [3, 4, 5, 8])
def test_each_buffer_has_one_reader_per_position(P):
    froms = [_messages(P, r)[1] for r in range(P)]
    for k in range(P - 1):
        assert sorted(f[k] for f in froms) == list(range(P))
