"""The overlapped pipeline's memo of a host's aligned intra lanes (schedule/hierarchical_overlap.cc,
host_intra): every local rank of a host builds the same aligned lanes of a tick, so the ranks built
one after another (the simulator, the verifier, auto's search) reuse them. Every rank's schedule
with the memo must equal, op for op, the one built without it (_C.set_overlap_memo(False)), over
hierarchical with the built-in and registered intra algorithms, pieces cut and capped, rail_halving
(paired by elements, ramped), rail_lanes (lanes of unequal counts), rail_window, unequal and
folded hosts, up to 64 ranks and awkward counts; and built in reverse rank order, so that the
lanes a rank reuses were built by another local rank; and an intra algorithm registered again from
Python under the same name is not served from the memo (its key holds the registry's generation)."""
import pytest

from commlib import _C

AR, F32 = _C.Collective.all_reduce, _C.DType.float32
PIECE = 4096  # hierarchical_overlap.cc, kMinPiece


def hosts_of(H, L):
    return [h for h in range(H) for _ in range(L)]


# (algorithm, hosts, count, inter, segment, intra, pieces or lanes or window, ramp or stagger)
CASES = [
    # hierarchical, built-in intra phases (inter must be named for a registered intra)
    ("hierarchical", hosts_of(2, 4), 4 * 3 * 8 * PIECE + 5, "", 4 * 8 * PIECE, "", 0, 0),
    ("hierarchical", hosts_of(4, 16), 1001, "ring", 250, "", 0, 0),
    ("hierarchical", [r % 5 for r in range(15)], 97, "rabenseifner", 19, "", 0, 0),  # interleaved, 5 hosts: folded
    ("hierarchical", hosts_of(3, 3), 3 * 3 * 8 * PIECE + 7, "rabenseifner", 3 * 8 * PIECE, "", 3, 0),  # pieces capped
    ("hierarchical", [0, 0, 0, 1, 1, 2, 2, 2, 2], 1013, "ring", 200, "", 0, 0),  # unequal: no overlap
    # registered intra algorithms
    ("hierarchical", hosts_of(2, 4), 4 * 3 * 8 * PIECE + 5, "ring", 4 * 8 * PIECE, "ring", 0, 0),
    ("hierarchical", hosts_of(3, 4), 777, "recursive_doubling", 150, "direct", 0, 0),
    ("hierarchical", hosts_of(4, 16), 3001, "rabenseifner", 700, "rail_ring", 0, 0),
    ("hierarchical", hosts_of(2, 5), 2 * 5 * 8 * PIECE + 3, "ring", 5 * 8 * PIECE, "ring", 2, 0),
    # rail_halving: by elements, ramped
    ("rail_halving", hosts_of(4, 4), 4099, "", 500, "", 0, 0),
    ("rail_halving", hosts_of(8, 8), 100003, "", 12000, "", 0, 2),
    ("rail_halving", hosts_of(2, 8), 16 * 8 * PIECE + 9, "", 4 * 8 * PIECE, "", 0, 1),
    # rail_lanes: three lanes of unequal counts, one rank's lanes one after another
    ("rail_lanes", hosts_of(4, 4), 50021, "", 4000, "", 3, 1),
    # rail_window, with registered intra phases
    ("rail_window", hosts_of(4, 4), 30011, "", 3000, "", 0, 0),
    ("rail_window", hosts_of(2, 8), 30011, "", 3000, "ring", 0, 0),
]


def build(case, ranks):
    algo, hosts, count, inter, segment, intra, extra, extra2 = case
    P = len(hosts)
    out = {}
    for r in ranks:
        out[r] = _C.schedule(AR, algo, r, P, count, 0, F32, hosts, inter, segment, intra, extra, extra2)
    return [out[r] for r in range(P)]


@pytest.fixture
def memo_restored():
    yield
    _C.set_overlap_memo(True)


@pytest.mark.timeout(120)
@pytest.mark.parametrize("case", CASES, ids=lambda c: f"{c[0]}-P{len(c[1])}-{c[5] or 'builtin'}")
def test_schedules_identical_with_and_without_the_memo(case, memo_restored):
    P = len(case[1])
    assert _C.set_overlap_memo(False) is True  # on by default
    plain = build(case, range(P))
    assert _C.set_overlap_memo(True) is False
    assert build(case, range(P)) == plain
    assert build(case, reversed(range(P))) == plain


@pytest.mark.timeout(120)
def test_a_reregistered_intra_algorithm_is_not_served_from_the_memo(memo_restored):
    """The memo's key holds the registry's generation: an intra algorithm registered from Python,
    removed and registered again under the same name with another builder, gets the new lanes."""
    import commlib

    name, hosts, count = "memo_probe", hosts_of(2, 4), 4 * 3 * 8 * PIECE + 5
    case = ("hierarchical", hosts, count, "ring", 4 * 8 * PIECE, name, 0, 0)
    P = len(hosts)

    def register(inner):
        for coll in ("reduce_scatter", "all_gather"):
            commlib.register_algorithm(coll, name, lambda r, s, c, root, coll=coll: commlib.schedule(coll, inner, r, s, c, root))

    def unregister():
        for coll in ("reduce_scatter", "all_gather"):
            commlib.unregister_algorithm(coll, name)

    built = {}
    try:
        for inner in ("ring", "direct"):
            register(inner)
            try:
                _C.set_overlap_memo(True)
                built[inner] = build(case, range(P))
                _C.set_overlap_memo(False)
                assert build(case, range(P)) == built[inner]
            finally:
                unregister()
    finally:
        _C.set_overlap_memo(True)
    assert built["ring"] != built["direct"]  # the second registration's lanes, not the first's
