"""A window of steps in flight in the model (ir.h Schedule::window, sim/run.h): rail_window's lanes
(one per segment, schedule/rail_window.cc) play as players of their own on a GPU preset, but a rank's
step i enters only once step i - D of its list has finished, so at most D of a rank's steps are ever
in flight; so on a CPU host's model too (tests/sim/test_cpu_host_lanes.py). The trace (up to 64
ranks) shows each rank's steps' entries and ends. The intra window (session 32) holds a rank's steps
inside the host back further."""
import pytest

from commlib import _C
from commlib.sim import topology as sim_topology

COUNT = (16 << 20) // 4  # 16 MiB of float32


def engine(topo, nodes):
    t = sim_topology.load(topo)
    return t.engine_dict(nodes * t.devices_per_host)


def trace(d, segments, window, stagger=0, count=COUNT):
    return _C.simulate_trace(_C.Collective.all_reduce, "rail_window", count, 4, 0, d, "", count // segments, "",
                             pieces=window, share=stagger)


def most_in_flight(steps):
    """The most steps of one rank between their entry and their end at one time."""
    events = sorted([(a, 1) for a, _ in steps] + [(b, -1) for _, b in steps], key=lambda e: (e[0], e[1]))
    most = now = 0
    for _, d in events:
        now += d
        most = max(most, now)
    return most


@pytest.mark.timeout(300)
def test_the_window_bounds_steps_in_flight():
    """2 dgx-h100 nodes (16 ranks), 16 segments: with a window of 1 no two steps of a rank overlap,
    with 4 at most 4 and some rank reaches 4 (the lanes do overlap), with 12 more than 4, and a wider
    window is faster
    (the one-step window waits out every step's latency in turn)."""
    d = engine("dgx-h100", 2)
    times = {}
    for window in (1, 4, 12):
        t = trace(d, 16, window)
        most = max(most_in_flight(s) for s in t["steps"])
        assert most <= window, (window, most)
        assert window == 1 or most >= min(window, 4) + (window > 4), (window, most)
        times[window] = t["time_s"]
    assert times[12] < times[4] < times[1], times


@pytest.mark.timeout(300)
def test_a_slow_step_holds_back_its_lane_and_the_window_only():
    """Listed lane after lane (a stagger of a whole segment) under a window of one segment's n
    steps: segment p + 1's first step waits for segment p's first to finish, not for segment p to
    end (steps need not start in list order), so the lanes still run side by side, more than two
    steps of a rank in flight, and within a few percent of the diagonal list's time (stagger 1)."""
    d = engine("dgx-h100", 2)
    n = trace(d, 16, 0)["steps"] and _C.schedule(_C.Collective.all_reduce, "rail_window", 0, 16, COUNT, 0,
                                                 _C.DType.float32, d["host_of"], "", COUNT // 16, "")["window"]
    after = trace(d, 16, n, stagger=n)
    diagonal = trace(d, 16, n, stagger=1)
    assert max(most_in_flight(s) for s in after["steps"]) > 2
    assert after["time_s"] < 1.1 * diagonal["time_s"], (after["time_s"], diagonal["time_s"])


@pytest.mark.timeout(120)
def test_the_shapes_auto_simulates():
    """rail_window's shapes (policy/window_shapes.cc), without playing them: below 4096 ranks K 128
    under a window of 5/2 segments' steps, ramped (R 2), direct inside the hosts, with an intra
    window of 3 first (session 32: 128 dgx-h100 nodes, 64 MiB, 360.0 us), then the same under two
    segments' steps without it (session 29: 365.9 us against the ring's 368.6), then the ring's
    four; from 4096 ranks one shape (session 33), K 64 under a window of 5n, ramped, direct, with an
    intra window of 2 (1024 nodes, 64 MiB: 361.2 us against the ring's K 64 D n R 2, 382.1)."""
    count = (64 << 20) // 4
    shapes = _C.simulated_shapes(_C.Collective.all_reduce, "rail_window", count, 4, engine("dgx-h100", 16))
    n = _C.schedule(_C.Collective.all_reduce, "rail_window", 0, 128, count, 0, _C.DType.float32,
                    [r // 8 for r in range(128)], "", count // 128, "direct", 0, 2 << 16)["window"]
    assert shapes[0] == {"segment": count // 128, "pieces": 5 * n // 2, "share": 3 << 24 | 2 << 16,
                         "intra_algorithm": "direct"}
    assert shapes[1] == {"segment": count // 128, "pieces": 2 * n, "share": 2 << 16, "intra_algorithm": "direct"}
    assert [(s["segment"], s["share"], s["intra_algorithm"]) for s in shapes[2:]] == [
        (count // K, 0, "") for K in (64, 128, 128, 32)]
    n = _C.schedule(_C.Collective.all_reduce, "rail_window", 0, 4096, count, 0, _C.DType.float32,
                    [r // 8 for r in range(4096)], "", count // 64, "direct", 0, 2 << 16)["window"]
    huge = _C.simulated_shapes(_C.Collective.all_reduce, "rail_window", count, 4, engine("dgx-h100", 512))
    assert huge == [{"segment": count // 64, "pieces": 5 * n, "share": 2 << 24 | 2 << 16, "intra_algorithm": "direct"}]


@pytest.mark.timeout(120)
def test_the_intra_window_holds_the_hosts_steps_back():
    """The intra window (session 32: ir.h Schedule::intra_window, rail_window's `share >> 24` = E): a
    step whose messages all stay inside the host also waits for the E-th such step before it. 2
    dgx-h100 nodes, 16 MiB in 16 segments with direct intra phases: E 1 (one such step of a rank at a
    time) is slower than none, E 3 plays another time, and an E past every such step of the list is
    no bound at all (the same time as none, to the bit)."""
    d = engine("dgx-h100", 2)

    def time_s(E):
        return _C.simulate(_C.Collective.all_reduce, "rail_window", COUNT, 4, 0, d, "", COUNT // 16, "direct",
                           pieces=0, share=E << 24)["time_s"]

    none, one, three, past = (time_s(E) for E in (0, 1, 3, 100))
    assert one > none and three != none, (none, one, three)
    assert past == none, (past, none)


@pytest.mark.timeout(120)
def test_radix4_between_hosts_plays_its_rounds():
    """rail_window's inter phase by recursive quartering (session 33, CollArgs::inter_algorithm
    "radix4", schedule/radix_exchange.h) in the model: 16 dgx-h100 nodes, 16 MiB in 16 segments with
    direct intra phases. A rank's messages between hosts are 3 a round in 2 rounds each way instead of
    1 in 4 (rabenseifner's): 12 a segment and rank instead of 8, the same bytes; the model plays
    them (another time), and the per-message CPU between hosts, a rank's (sim/run.h post_sends), grows
    with the count: 1.5x rabenseifner's."""
    d = engine("dgx-h100", 16)

    def run(inter):
        return _C.simulate(_C.Collective.all_reduce, "rail_window", COUNT, 4, 0, d, inter, COUNT // 16, "direct")

    two, four = run(""), run("radix4")
    assert four["bytes_inter"] == two["bytes_inter"]
    # 128 ranks x 16 segments x (12 - 8) more messages a segment and rank (rabenseifner's 2 log2 16)
    assert four["transfers"] - two["transfers"] == 128 * 16 * 4, (two["transfers"], four["transfers"])
    assert four["time_s"] != two["time_s"]
    assert four["cpu_busy_s"] == pytest.approx(1.5 * two["cpu_busy_s"], rel=1e-6), (two["cpu_busy_s"], four["cpu_busy_s"])
