"""auto's tie rule (csrc/policy/tie_rule.h, docs/simulator.md "Ties in auto's ranking"): candidates the
model predicts alike to the last bits resolve to the one listed first, whichever way the rounding of
their sums falls, in the search, the full ranking and the simulator's auto alike.

The case is session 27's: 3 ranks on 2 dgx-h100 hosts, all_gather, where direct (listed before
rail_ring) and rail_ring are predicted alike; the same bytes counted as elements of another size round
their sums differently: rail_ring a few ulps faster (280004 bytes as float32), direct a few ulps faster
(120004 bytes), or exactly equal (280004 bytes as 1-byte elements)."""
import pytest

from commlib import _C
from commlib.core.call_spec import COLLECTIVE
from commlib.sim import ranking
from commlib.sim import topology as sim_topology

# (bytes, element size, how rounding orders direct and rail_ring)
ROUNDINGS = [(280004, 4, "rail_ring first"), (120004, 4, "direct first"), (280004, 1, "equal")]


@pytest.fixture
def two_hosts(monkeypatch):
    monkeypatch.delenv("COMMLIB_ALGO_ALL_GATHER", raising=False)
    _C.clear_tuning()
    _C.clear_candidate_cache()
    d = sim_topology.load("dgx-h100").engine_dict(3)
    d.update(host_of=[0, 0, 1])
    yield d
    _C.clear_candidate_cache()
    from commlib import tuning
    tuning.load_default()


@pytest.mark.parametrize("nbytes,elem,order", ROUNDINGS, ids=[r[2] for r in ROUNDINGS])
def test_a_tie_to_the_last_bits_goes_to_the_first_listed(two_hosts, nbytes, elem, order):
    count = nbytes // elem
    cands = _C.predict_candidates(COLLECTIVE["all_gather"], count, elem, 0, two_hosts)
    t = {c["algorithm"]: c["predicted_s"] for c in cands if not c["inter_algorithm"]}
    names = [c["algorithm"] for c in cands]
    assert names.index("direct") < names.index("rail_ring")
    # The case is what it says: the two the fastest, a tie within a few ulps, rounded the stated way.
    assert min(c["predicted_s"] for c in cands) == min(t["direct"], t["rail_ring"])
    assert abs(t["direct"] - t["rail_ring"]) <= 1e-15 * t["direct"]
    assert {"rail_ring first": t["rail_ring"] < t["direct"], "direct first": t["direct"] < t["rail_ring"],
            "equal": t["direct"] == t["rail_ring"]}[order]
    # Python's min follows the rounding; the rule does not.
    assert ranking.tie_pick(cands)["algorithm"] == "direct"
    search = _C.search_candidates(COLLECTIVE["all_gather"], count, elem, 0, two_hosts)
    _C.clear_candidate_cache()
    full = _C.resolve_algorithm(COLLECTIVE["all_gather"], "auto", count, elem, 0, 3, [0, 0, 1], two_hosts)
    assert full["candidates"], full  # the full ranking decided it
    _C.clear_candidate_cache()
    played = _C.simulate(COLLECTIVE["all_gather"], "auto", count, elem, 0, two_hosts)
    assert (search["algorithm"], full["algorithm"], played["algorithm"]) == ("direct",) * 3
    assert search["predicted_s"] == full["predicted_s"] == t["direct"]


def test_the_same_bytes_resolve_alike_at_every_element_size(two_hosts):
    # Session 27's symptom: 280004 bytes as float32 resolved to rail_ring, as 1-byte elements to direct.
    picks = {(nbytes, elem): _C.search_candidates(COLLECTIVE["all_gather"], nbytes // elem, elem, 0, two_hosts)["algorithm"]
             for nbytes in (120004, 280004) for elem in (1, 2, 4)}
    assert set(picks.values()) == {"direct"}, picks


def test_tie_pick_keeps_the_order_within_the_tie_and_not_beyond():
    eps = _C.AUTO_TIE_RELATIVE
    assert 0 < eps <= 1e-6
    row = lambda name, t: {"algorithm": name, "predicted_s": t}
    assert ranking.tie_pick([row("a", 1.0 + eps / 2), row("b", 1.0)])["algorithm"] == "a"
    assert ranking.tie_pick([row("a", 1.0 + 4 * eps), row("b", 1.0)])["algorithm"] == "b"
    assert ranking.tie_pick([row("a", float("inf")), row("b", 2.0)])["algorithm"] == "b"
    with pytest.raises(ValueError, match="finite"):
        ranking.tie_pick([row("a", float("inf"))])
