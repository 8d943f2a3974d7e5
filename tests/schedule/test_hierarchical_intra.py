"""Hierarchical schedules whose intra-host phases run a registered algorithm too
(CollArgs::intra_algorithm, through the sub-group combinator): every (inter, intra) pair of each
collective proven by the symbolic verifier on host maps up to 64 ranks (equal, uneven, interleaved,
one rank per host), maps and counts rotating over the pairs (pairwise, not the full product), in
place and out of place; the pipelined all_reduce; the intra phase really is the algorithm asked
for; bad names are refused naming intra_algorithm."""
import itertools
import random

import pytest

import commlib
from commlib import _C
from commlib.core.call_spec import COLLECTIVE

COLLECTIVES = ("all_reduce", "all_gather", "reduce_scatter", "broadcast")


def flat(coll):
    # One-sided algorithms cannot run a phase (tests/schedule/test_one_sided.py).
    return [a for a in commlib.algorithms(coll) if a not in ("hierarchical", "rail_split", "rail_halving", "rail_lanes", "rail_window")]


def intra_algorithms(coll):
    if coll == "all_reduce":  # both intra phases: a name of reduce_scatter and all_gather
        return [a for a in flat("reduce_scatter") if a in flat("all_gather")]
    return flat(coll)


def host_maps():
    rng = random.Random(25)
    return [[0, 0, 1, 1], [0, 0, 1, 2, 2, 2], [1, 0, 1, 0, 2], [0, 1, 1, 1, 1, 2, 2],
            [2, 2, 0, 1, 1, 0, 3], [h for h in range(4) for _ in range(16)],
            [rng.randrange(9) for _ in range(64)], list(range(8)), [0] * 5]


def schedules(coll, hosts, count, root, inter, intra, segment=0):
    P = len(hosts)
    return [_C.schedule(COLLECTIVE[coll], "hierarchical", r, P, count, root, _C.DType.float32, hosts, inter, segment, intra)
            for r in range(P)]


@pytest.mark.parametrize("collective", COLLECTIVES)
def test_every_inter_intra_pair_verified(collective):
    maps = host_maps()
    pairs = list(itertools.product(flat(collective), intra_algorithms(collective)))
    big = [m for m in maps if len(m) == 64]
    for k, (inter, intra) in enumerate(pairs):
        # Three maps per pair, rotating so every map meets every intra algorithm; one 64-rank map
        # per intra algorithm (the first pairs of each).
        chosen = [maps[(k * 3 + d) % len(maps)] for d in range(3)]
        if k < len(intra_algorithms(collective)) * 2 and not any(len(m) == 64 for m in chosen):
            chosen.append(big[k % len(big)])
        for m, hosts in enumerate(chosen):
            P = len(hosts)
            count = [0, 1, P + 3, 37][(k + m) % 4]
            root = (k * 5 + m) % P if collective == "broadcast" else 0
            _C._verify_custom(COLLECTIVE[collective], P, count, schedules(collective, hosts, count, root, inter, intra), root)


@pytest.mark.parametrize("intra", intra_algorithms("all_reduce"))
def test_pipelined_all_reduce_with_intra_algorithm(intra):
    """Segments of 5 elements (up to 16): the tick order of the composed pipeline with multi-step
    intra phases, on equal and uneven hosts."""
    for hosts, inter in (([0, 0, 1, 1], "ring"), ([0, 0, 1, 2, 2, 2], "tree"), ([h % 3 for h in range(9)], "rabenseifner"),
                         ([2, 2, 0, 1, 1, 0, 3], "recursive_doubling")):
        P = len(hosts)
        for count in (10, 101):
            _C._verify_custom(_C.Collective.all_reduce, P, count, schedules("all_reduce", hosts, count, 0, inter, intra, 5), 0)


def intra_peers_per_step(coll, intra, hosts, count=64):
    """The most local peers rank 0 talks to in one step."""
    inter = "binomial" if coll == "broadcast" else "ring"
    s = _C.schedule(COLLECTIVE[coll], "hierarchical", 0, len(hosts), count, 0, _C.DType.float32, hosts, inter, 0, intra)
    return max(len({op["peer"] for op in st if op["peer"] is not None and hosts[op["peer"]] == hosts[0]})
               for st in s["steps"])


def test_intra_phase_uses_the_intra_algorithm():
    """8 ranks on each of 2 hosts: the built-in and direct intra phases talk to all 7 local peers
    in one step; ring to its two neighbours at most."""
    hosts = [h for h in range(2) for _ in range(8)]
    for coll in ("all_reduce", "all_gather", "reduce_scatter"):
        assert intra_peers_per_step(coll, "", hosts) == 7
        assert intra_peers_per_step(coll, "ring", hosts) <= 2
    assert intra_peers_per_step("broadcast", "binomial", hosts) == 1
    assert intra_peers_per_step("broadcast", "", hosts) == 7


@pytest.mark.parametrize("collective", COLLECTIVES)
def test_verifier_rejects_a_broken_intra_phase(collective):
    hosts = [0, 0, 1, 2, 2, 2]
    intra = intra_algorithms(collective)[0]
    for victim in (0, 3):
        s = schedules(collective, hosts, 13, 0, flat(collective)[0], intra)
        steps = s[victim]["steps"]
        local = [k for k, st in enumerate(steps)
                 if any(op["peer"] is not None and hosts[op["peer"]] == hosts[victim] for op in st)]
        del steps[local[0]]
        with pytest.raises(_C.VerificationError):
            _C._verify_custom(COLLECTIVE[collective], len(hosts), 13, s, 0)


def test_bad_intra_algorithm_is_named():
    hosts = [0, 0, 1, 1]
    with pytest.raises(ValueError, match="intra_algorithm.*nope"):
        _C.schedule(_C.Collective.all_gather, "hierarchical", 0, 4, 10, 0, _C.DType.float32, hosts, "ring", 0, "nope")
    with pytest.raises(ValueError, match="intra_algorithm.*needs an inter"):
        _C.schedule(_C.Collective.broadcast, "hierarchical", 0, 4, 10, 0, _C.DType.float32, hosts, "", 0, "binomial")
    with pytest.raises(ValueError, match="intra_algorithm.*reduce_scatter and all_gather"):
        _C.schedule(_C.Collective.all_reduce, "hierarchical", 0, 4, 10, 0, _C.DType.float32, hosts, "ring", 0, "bruck")
    with pytest.raises(ValueError, match="intra_algorithm"):
        _C.schedule(_C.Collective.reduce_scatter, "hierarchical", 0, 4, 10, 0, _C.DType.float32, hosts, "ring", 0, "hierarchical")
