"""What the device paths run of a laned schedule (csrc/kernels/device_list.h, issue #39): where the
lanes are in lock step (a block of the list in round order: rail_ring's channels, rail_split's rings
and a hierarchical part in lock step beside them; a list under a window: rail_window's segments)
every lane's k-th step is one step of the device list, so rail_ring's C channels run as C concurrent
exchanges a round (one grid barrier), not C steps; rail_lanes (lanes not in lock step, listed one
after another) stays in list order, and so does rail_split's hierarchical part where it is listed
after the rings. Proven here: the merged lists replayed by the verifier (in place and out of place,
the lane checks left out: the merged list is one lane) on the host maps the lanes' own sweeps cover
(tests/schedule/test_rail_ring.py, test_rail_window.py), P up to 64, awkward counts (where
rail_split lists its parts one after another, the rings' block merges and the hierarchical part runs
as it is); the device plans of the merged lists checked step for step and across ranks, every chunk
received at the step index it is sent at (check_device_plans); the plan's steps counted; and why
rail_lanes is not merged (merged, its lanes' messages meet out of order)."""
import os
import sys

import pytest

from commlib import _C
from commlib.core.call_spec import COLLECTIVE

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "schedule"))
from test_rail_ring import SPLITS, channels, host_maps, split_schedules  # noqa: E402
from test_rail_window import PAIRED  # noqa: E402

RING_COLLECTIVES = ("all_reduce", "all_gather", "reduce_scatter")


def ring_rounds(coll, P):
    """A ring's steps: 2 (P - 1) for all_reduce, P - 1 for all_gather and reduce_scatter."""
    return (2 if coll == "all_reduce" else 1) * (P - 1)


def device_lists(scheds):
    return [_C.device_list(s, s["lanes"]) for s in scheds]


def verify_merged(coll, P, count, lists):
    """The verifier's replay of the device lists in their order, one step after another (a merged
    list is one lane; a list left as it is is replayed in list order, its lanes' names dropped)."""
    plain = [{"steps": d["steps"], "scratch_count": d["scratch_count"]} for d in lists]
    _C._verify_custom(COLLECTIVE[coll], P, count, plain, 0, lanes=1)


def ring_schedules(coll, hosts, count):
    P = len(hosts)
    return [_C.schedule(COLLECTIVE[coll], "rail_ring", r, P, count, 0, _C.DType.float32, hosts) for r in range(P)]


@pytest.mark.parametrize("coll", RING_COLLECTIVES)
def test_rail_ring_device_list_is_one_step_a_round(coll):
    """Counted: rail_ring's device list has one step a ring round (C channels in it), its list C
    steps a round; the device plan's steps are the rounds (2 hosts x 2 ranks: 2 channels, one host of
    5: the ring and its reverse, 2 hosts x 8: 8 channels)."""
    for hosts in ([0, 0, 1, 1], [0] * 5, [h for h in range(2) for _ in range(8)]):
        P, C = len(hosts), channels(hosts)
        scheds = ring_schedules(coll, hosts, 64 * P + 7)
        assert {s["lanes"] for s in scheds} == {C} and C > 1
        assert {len(s["steps"]) for s in scheds} == {C * ring_rounds(coll, P)}
        lists = device_lists(scheds)
        assert all(d["merged"] for d in lists)
        assert {len(d["steps"]) for d in lists} == {ring_rounds(coll, P)}
        # each step of the device list holds every channel's step of that round: C sends, C receives
        assert all(sum(op["op"] == "send" for op in st) == C for d in lists for st in d["steps"])
        for r in (0, P - 1):
            plan = _C.device_plan(COLLECTIVE[coll], "rail_ring", r, P, 64 * P + 7, hosts=hosts)
            assert len(plan["steps"]) == ring_rounds(coll, P), (hosts, r, len(plan["steps"]))


@pytest.mark.timeout(300)
@pytest.mark.parametrize("coll", RING_COLLECTIVES)
def test_rail_ring_merged_lists_verified_and_planned(coll):
    """Every host map of rail_ring's sweep (1..64 ranks), counts 0, 1, P + 3, 37: the merged lists
    pass the verifier and the device plan check (the plans across ranks, step for step)."""
    for k, hosts in enumerate(host_maps()):
        P = len(hosts)
        count = [0, 1, P + 3, 37][k % 4]
        scheds = ring_schedules(coll, hosts, count)
        lists = device_lists(scheds)
        assert all(d["merged"] == (s["lanes"] > 1) for d, s in zip(lists, scheds)), hosts
        verify_merged(coll, P, count, lists)
        _C.check_device_plans(COLLECTIVE[coll], "rail_ring", P, count, 0, esize=2, chunk_bytes=64, hosts=hosts)


@pytest.mark.timeout(300)
@pytest.mark.parametrize("inter,intra,segments,pieces,share", SPLITS)
def test_rail_split_device_lists_verified(inter, intra, segments, pieces, share):
    """rail_split on rail_ring's host maps (every other one, as its own sweep): the device lists
    (every lane's rounds merged where the parts are listed round by round, the rings' only where the
    parts are listed one after another) pass the verifier; the default composition merges on equal
    hosts of even size."""
    turn = SPLITS.index((inter, intra, segments, pieces, share)) % 2
    merged = 0
    for k, hosts in enumerate(host_maps()):
        if k % 2 != turn:
            continue
        P = len(hosts)
        count = [0, 1, 2, P + 3, 37, 64 * P + 7][(k + len(inter)) % 6]
        scheds = split_schedules(hosts, count, inter, intra, segments, pieces, share)
        lists = device_lists(scheds)
        merged += all(d["merged"] for d in lists)
        verify_merged("all_reduce", P, count, lists)
    assert merged > 0
    hosts = [h for h in range(2) for _ in range(4)]
    assert all(d["merged"] for d in device_lists(split_schedules(hosts, 64 * 8 + 7, "", "", 0, 0, 0)))


def test_rail_split_parts_one_after_another_merge_the_rings_only():
    """Where rail_split lists its parts one after another (the hierarchical part, two_shot between
    hosts and ring inside, not in lock step on hosts of 2, 1 and 3), the rings' block merges (C x
    2 (P - 1) steps into 2 (P - 1)) and the hierarchical part follows as it is, on every rank; the
    lists pass the verifier and the plans their check."""
    hosts = [0, 0, 1, 2, 2, 2]
    P, C, n = 6, channels(hosts), 64 * 6 + 7
    scheds = split_schedules(hosts, n, "two_shot", "ring", 8, 2, 0)
    lists = device_lists(scheds)
    for s, d in zip(scheds, lists):
        lanes = s["step_lanes"]
        rings = C * 2 * (P - 1)
        assert lanes[:rings] == [k % C for k in range(rings)] and set(lanes[rings:]) == {C}
        assert d["merged"] and len(d["steps"]) == len(s["steps"]) - (C - 1) * 2 * (P - 1)
        assert d["steps"][2 * (P - 1):] == s["steps"][C * 2 * (P - 1):]
    verify_merged("all_reduce", P, n, lists)


@pytest.mark.timeout(300)
@pytest.mark.parametrize("hosts", [m for m in host_maps() if len(m) <= 16], ids=lambda h: f"{len(set(h))}x{len(h)}")
def test_rail_split_device_plans_checked(hosts):
    """The device plans of rail_split's device lists (the default composition, 4 pipeline segments
    and none) on the host maps up to 16 ranks: each plan its list, the pairs across ranks."""
    P = len(hosts)
    for n, segment in ((0, 0), (1, 0), (P + 3, 1), (64 * P + 7, 8 * P)):
        _C.check_device_plans(COLLECTIVE["all_reduce"], "rail_split", P, n, 0, esize=2, chunk_bytes=64, hosts=hosts,
                              segment=segment)


def window_schedules(hosts, count, segment, window=0, stagger=0):
    P = len(hosts)
    return [_C.schedule(_C.Collective.all_reduce, "rail_window", r, P, count, 0, _C.DType.float32, hosts, "",
                        segment, "", window, stagger) for r in range(P)]


@pytest.mark.timeout(300)
@pytest.mark.parametrize("hosts", PAIRED, ids=lambda h: f"{len(set(h))}x{len(h)}")
def test_rail_window_merged_lists_verified_and_planned(hosts):
    """rail_window on the host maps where it has lanes (equal power-of-two hosts, 4 to 64 ranks):
    every segment's step j in one step of the device list (its plain form's steps, not K times
    them), verified, and its plans checked across ranks."""
    P = len(hosts)
    cases = [(97, 49, 0, 0), (P * 8 * 4 + 3, P * 8, 0, 0), (P * 8 * 3 + 1, P * 3, 40, 3), (P * 2 * 64 + 7, P * 2, 0, 2),
             (P * 8 * 4 + 3, P * 8, 0, 1 << 16)]
    if P == 64:
        cases = [(97, 7, 0, 0), (64 * 16 + 5, 64 * 4, 0, 2), (64 * 8 * 4 + 3, 64 * 8, 0, 1 << 16)]
    laned = 0
    for count, segment, window, stagger in cases:
        scheds = window_schedules(hosts, count, segment, window, stagger)
        lists = device_lists(scheds)
        W = scheds[0]["lanes"]
        assert all(d["merged"] == (W > 1) for d in lists)
        if W > 1:
            laned += 1
            assert len(lists[0]["steps"]) * W == len(scheds[0]["steps"]), (W, len(lists[0]["steps"]))
        verify_merged("all_reduce", P, count, lists)
    assert laned >= 2
    for n, segment, window in ((97, 7, 0), (64 * P + 7, 8 * P, 3)):
        _C.check_device_plans(COLLECTIVE["all_reduce"], "rail_window", P, n, 0, esize=2, chunk_bytes=64, hosts=hosts,
                              segment=segment, pieces=window)


def merge_rounds(s):
    """Every lane's k-th step in one step (what device_list would do), whatever the list order."""
    lanes, out, seen = s.get("step_lanes", [0] * len(s["steps"])), [], {}
    for st, lane in zip(s["steps"], lanes):
        k = seen[lane] = seen.get(lane, -1) + 1
        out += [[] for _ in range(k + 1 - len(out))]
        out[k] += st
    return {"steps": [st for st in out if st], "scratch_count": s["scratch_count"]}


def test_rail_lanes_stays_in_list_order_and_why():
    """rail_lanes lists its lanes one after another and is run so (its device list is its list):
    its lanes, each a pipelined rail_halving, are not in lock step, and merged by rounds a pair's
    messages of two lanes meet out of order (2 hosts x 8, 97 elements in segments of 7, 2 lanes: the
    verifier finds elements of different offsets reduced together). Where they happen to be in lock
    step (2 x 4, 263 elements) the merge would pass; the rule reads the list, not the luck."""
    hosts = [h for h in range(2) for _ in range(8)]
    scheds = [_C.schedule(_C.Collective.all_reduce, "rail_lanes", r, 16, 97, 0, _C.DType.float32, hosts, "", 7, "", 2)
              for r in range(16)]
    assert scheds[0]["lanes"] == 2
    lists = device_lists(scheds)
    assert not any(d["merged"] for d in lists)
    assert [d["steps"] for d in lists] == [s["steps"] for s in scheds]
    verify_merged("all_reduce", 16, 97, lists)
    with pytest.raises(AssertionError, match="reduc"):
        _C._verify_custom(COLLECTIVE["all_reduce"], 16, 97, [merge_rounds(s) for s in scheds], 0, lanes=1)
    for n, segment, pieces in ((97, 7, 2), (64 * 16 + 7, 128, 4)):
        _C.check_device_plans(COLLECTIVE["all_reduce"], "rail_lanes", 16, n, 0, esize=2, chunk_bytes=64, hosts=hosts,
                              segment=segment, pieces=pieces)


def test_device_list_leaves_one_lane_and_bad_lanes_alone():
    """A schedule of one lane (ring), or whose steps name lanes outside the count, is run as it is."""
    s = _C.schedule(COLLECTIVE["all_reduce"], "ring", 0, 4, 100)
    d = _C.device_list(s, 1)
    assert not d["merged"] and d["steps"] == s["steps"]
    r = ring_schedules("all_reduce", [0, 0, 1, 1], 100)[0]
    assert not _C.device_list(r, 1)["merged"]  # lanes=1: list order whatever the step lanes
    assert _C.device_list(r, 2)["merged"]
    bad = dict(r, step_lanes=[3] + r["step_lanes"][1:])
    assert not _C.device_list(bad, 2)["merged"]
