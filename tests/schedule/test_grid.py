"""all_reduce's two-shot over a grid (csrc/schedule/all_reduce_grid.cc): proven where it cuts the buffer
into pieces whose row and column stages share steps (test_verify_all's counts stay below a second
piece), in place and out of place, at square, oblong and prime world sizes; and the property it
exists for: a rank talks only to its row and its column, 2(R-1) + 2(C-1) messages a piece instead of
the two-shot's 2(P-1)."""
import pytest

from commlib.core import schedules

PIECE = 4096  # kMinPiece: the fewest elements of a piece


def grid(P):
    c = max(d for d in range(1, int(P ** 0.5) + 1) if P % d == 0)
    return P // c, c


@pytest.mark.parametrize("P", [2, 4, 6, 12, 31, 64])
def test_grid_pieces_verified(P):
    for n in (2 * PIECE + 1, 3 * PIECE + P, 6 * PIECE, 9 * PIECE + 7):
        schedules.verify("all_reduce", "grid", P, n)


@pytest.mark.parametrize("P,pieces", [(64, 1), (64, 6), (12, 3), (31, 2)])
def test_grid_talks_to_its_row_and_column_only(P, pieces):
    R, C = grid(P)
    for r in (0, P // 2, P - 1):
        s = schedules.schedule("all_reduce", "grid", r, P, pieces * PIECE)
        sends = [op["peer"] for step in s["steps"] for op in step if op["op"] == "send"]
        assert set(sends) == {q for q in range(P) if q != r and (q // C == r // C or q % C == r % C)}
        assert len(sends) == pieces * 2 * (R - 1 + C - 1)
