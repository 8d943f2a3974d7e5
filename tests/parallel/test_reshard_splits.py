"""The arithmetic of a sharded grow (commlib/parallel/_reshard.py), without processes: for every
unit size and every pair of world sizes, the all_to_all splits that each rank of the grown world
computes on its own agree with one another (what i sends j is what j expects from i) and move
every element of the unit exactly once from its old owner to its new one."""
import pytest

pytest.importorskip("torch")

from commlib.parallel._reshard import move_splits, piece_of  # noqa: E402


def _owner(element, numel, world):
    return element // piece_of(numel, world)


@pytest.mark.parametrize("numel", [1, 2, 3, 7, 31, 35, 64])
def test_splits_move_every_element_once_from_its_old_owner_to_its_new_one(numel):
    for old in range(1, 7):
        for new in range(old, 9):
            splits = [move_splits(numel, old, new, r) for r in range(new)]
            for i in range(new):
                for j in range(new):  # i's send to j is j's receive from i
                    assert splits[i][0][j] == splits[j][1][i], (numel, old, new, i, j)
            for r, (ins, outs) in enumerate(splits):
                # old pieces in rank order, new pieces in rank order: contiguous runs of elements
                sent = [_owner(e, numel, new) for e in range(numel) if _owner(e, numel, old) == r]
                got = [_owner(e, numel, old) for e in range(numel) if _owner(e, numel, new) == r]
                assert ins == [sent.count(j) for j in range(new)], (numel, old, new, r)
                assert outs == [got.count(i) for i in range(new)], (numel, old, new, r)
