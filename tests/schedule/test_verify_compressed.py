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


HOST_MAPS = ([0, 0, 1, 1], [0, 0, 0, 1, 1, 1], [0, 0, 1, 1, 2, 2], [0, 0, 0, 0, 1, 1, 1, 1])


@pytest.mark.parametrize("collective", COLLECTIVES)
def test_hierarchical_inter_only_ends_identical(collective):
    """compress_inter_only: intra-host messages raw, inter-host encoded; all_gather's blocks are
    projected first across hosts (without that, a block sent raw and encoded differs)."""
    for host_of in HOST_MAPS:
        for count in (0, 1, 13, 97):
            assert verify(collective, "hierarchical", len(host_of), count, host_of=host_of,
                          inter_only=True) == "hierarchical"


def test_inter_only_all_gather_projects_blocks_first():
    """Flat all_gathers send a block raw within its host and encoded across: proved only because
    every rank projects its own block before anything travels."""
    for algorithm in ("direct", "ring", "bruck"):
        for host_of in HOST_MAPS:
            assert verify("all_gather", algorithm, len(host_of), 13, host_of=host_of, inter_only=True) == algorithm


def test_inter_only_rejects_what_it_cannot_prove():
    """direct all_reduce's owner sends its sum raw to one peer and encoded to another: refused."""
    with pytest.raises(commlib.VerificationError, match="bitwise identical"):
        verify("all_reduce", "direct", 4, 13, host_of=[0, 0, 1, 1], inter_only=True)


def test_the_host_map_decides_hierarchical_under_a_codec():
    """On uneven hosts (3 + 2) hierarchical's fully encoded all_reduce re-codes differently placed
    shards: refused with the host map, though proved on one host (the map must be passed)."""
    assert verify("all_reduce", "hierarchical", 5, 13) == "hierarchical"
    with pytest.raises(commlib.VerificationError, match="bitwise identical"):
        verify("all_reduce", "hierarchical", 5, 13, host_of=[0, 0, 0, 1, 1])
    assert verify("all_reduce", "hierarchical", 5, 13, host_of=[0, 0, 0, 1, 1], inter_only=True)
