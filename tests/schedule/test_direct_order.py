"""The message order of all_to_all's and all_gather's direct schedules (csrc/schedule/all_to_all.cc,
all_gather.cc). The host executor takes a step's messages in op order, so every send comes first (a
single-copy send only publishes the buffer; a receive reads a whole block before the executor moves
on), rank r's k-th send goes to r+k and its k-th receive comes from r-k: at every position each
rank's buffer has exactly one reader (all P-1 readers on rank 0's buffer first is what the rotation
avoids). Nothing else changes: one step, the own block copied, every block sent and received once."""
import pytest

from commlib.core import schedules


def _messages(collective, P, r, n=3):
    (step,) = schedules.schedule(collective, "direct", rank=r, size=P, count=n)["steps"]
    own = ("input", r * n if collective == "all_to_all" else 0, n)
    assert step[0] == {"op": "copy", "peer": None, "dst": ("output", r * n, n), "src": own}
    rest = step[1:]
    sends = [op for op in rest if op["op"] == "send"]
    assert [op["op"] for op in rest] == ["send"] * (P - 1) + ["recv"] * (P - 1)  # every send before any read
    for op in sends:
        assert op["src"] == (("input", op["peer"] * n, n) if collective == "all_to_all" else ("input", 0, n))
    for op in rest[P - 1:]:
        assert op["dst"] == ("output", op["peer"] * n, n)
    return [op["peer"] for op in sends], [op["peer"] for op in rest[P - 1:]]


@pytest.mark.parametrize("collective", ["all_to_all", "all_gather"])
@pytest.mark.parametrize("P", [1, 2, 3, 4, 5, 8])
def test_direct_sends_first_to_peers_in_rotated_order(collective, P):
    for r in range(P):
        to, frm = _messages(collective, P, r)
        assert to == [(r + k) % P for k in range(1, P)]
        assert frm == [(r - k) % P for k in range(1, P)]


@pytest.mark.parametrize("collective", ["all_to_all", "all_gather"])
@pytest.mark.parametrize("P", [3, 4, 5, 8])
def test_each_buffer_has_one_reader_per_position(collective, P):
    froms = [_messages(collective, P, r)[1] for r in range(P)]
    for k in range(P - 1):
        assert sorted(f[k] for f in froms) == list(range(P))
