"""The verifier's model of compress= (docs/compression.md, "Why every rank ends identical"): every
algorithm of the three compressible collectives, played with the host lowering's codec rules,
leaves every rank the same values; a lowering that forgets the sender's projection is rejected."""
import pytest

import commlib
from commlib.codecs import verify

COLLECTIVES = ("all_reduce", "reduce_scatter", "all_gather")


@pytest.mark.parametrize("collective", COLLECTIVES)
def test_every_algorithm_ends_identical_under_a_codec(collective):
    for algorithm in commlib.algorithms(collective):
        for size in (1, 2, 3, 4, 5, 7, 8):
            if algorithm == "rabenseifner" and size & (size - 1):
                continue  # below
            for count in (0, 1, size - 1, size, 13, 97):
                assert verify(collective, algorithm, size, count) == algorithm


@pytest.mark.parametrize("size", [3, 5, 7])
def test_rabenseifners_fold_is_rejected(size):
    """At non-powers of two Rabenseifner's last step sends two shards, coded apart, as one message:
    re-coded together (one scale for both) they change on the sender and its receiver only."""
    with pytest.raises(commlib.VerificationError, match="codec projected"):
        verify("all_reduce", "rabenseifner", size, 13)


@pytest.mark.parametrize("collective,algorithm", [("all_reduce", "ring"), ("all_reduce", "recursive_doubling"),
                                                  ("all_reduce", "rabenseifner"), ("all_reduce", "direct"),
                                                  ("all_gather", "ring"), ("all_gather", "direct")])
def test_a_lowering_without_the_senders_projection_is_rejected(collective, algorithm):
    with pytest.raises(commlib.VerificationError, match="bitwise identical"):
        verify(collective, algorithm, 4, 13, sender_projects=False)


def test_bad_arguments_are_named():
    with pytest.raises(ValueError, match="collective"):
        verify("broadcast", "ring", 2, 4)
    with pytest.raises(ValueError, match="size"):
        verify("all_reduce", "ring", 0, 4)
