"""The simulator's CPU-scheduling terms (docs/simulator.md, "Waiting"): ranks beyond a host's cores
(cores_per_host: software costs and byte rates scale, every receive pays the wake-up and a share of
the scheduler quantum) and spin-then-sleep receives (spin_s, wake_s). Each test fails if its term is removed:
it pins the exact difference the term makes on a tiny topology."""
import dataclasses

import pytest

from commlib import sim
import commlib._C as _C
from commlib.sim import fit_sched
from commlib.sim.topology import TopologyError, load
from test_closed_forms import uniform
from commlib.core.call_spec import COLLECTIVE

US = 1e-6


def one_host(P, latency_s=5 * US, **extra):
    """P ranks on one host; transfers cost their latency only (huge port, no reduction)."""
    t = uniform(P)
    t.update(host_of=[0] * P, nic_of=[0] * P, intra_latency_s=latency_s, intra_port_Bps=1e18,
             reduce_s_per_byte=0.0, **extra)
    return t


def time_s(t, collective="broadcast", algorithm="binomial", count=2):
    return _C.simulate(COLLECTIVE[collective], algorithm, count, 4, 0, t)["time_s"]


def test_oversubscribed_receive_pays_wake_and_quantum_share():
    # 2-rank broadcast: one message, latency L = 5 us, inside the 10 us spin window. Then 4 ranks on 1
    # host: ring all_reduce, 6 receives in a row.
    terms = dict(spin_s=10 * US, wake_s=3 * US, sched_quantum_s=40 * US)
    free = time_s(one_host(2, **terms))  # no cores_per_host: a core each
    assert free == pytest.approx(5 * US, rel=1e-12)
    own = time_s(one_host(2, cores_per_host=2, **terms))
    assert own == pytest.approx(free, rel=1e-12)  # as many cores as ranks: not oversubscribed
    shared = time_s(one_host(2, cores_per_host=1, **terms))  # sleeps despite the spin window: no core to spin on
    assert shared - free == pytest.approx((3 + (2 / 1 - 1) * 40) * US, rel=1e-9)
    # 4 ranks on 1 core: f = 4, each of the ring's 2(P-1) steps waits wake + 3 quanta on the critical path.
    base = time_s(one_host(4), "all_reduce", "ring", 8)
    over = time_s(one_host(4, cores_per_host=1, wake_s=3 * US, sched_quantum_s=40 * US), "all_reduce", "ring", 8)
    assert over - base == pytest.approx(6 * (3 + 3 * 40) * US, rel=1e-9)


def test_oversubscription_scales_software_costs():
    # 4 ranks on 2 cores (f = 2): the ring's 6 op overheads and 5 step overheads take twice as long.
    costs = dict(op_overhead_s=1 * US, step_overhead_s=0.5 * US)
    base = time_s(one_host(4, **costs), "all_reduce", "ring", 8)
    over = time_s(one_host(4, cores_per_host=2, **costs), "all_reduce", "ring", 8)
    assert over - base == pytest.approx((2 - 1) * (6 * 1 + 5 * 0.5) * US, rel=1e-9)


def test_oversubscription_divides_byte_rates():
    # 2 ranks on 1 core (f = 2): a 1 MB message at 1 GB/s per port takes twice as long, and so do the
    # schedule's local copies (binomial broadcast's root copies its input to its output, out of place).
    t = one_host(2, latency_s=0.0)
    t.update(intra_port_Bps=1e9)
    base = time_s(t, count=250_000)
    over = time_s(dict(t, cores_per_host=1), count=250_000)
    assert base == pytest.approx(1e6 / 1e9, rel=1e-12) and over == pytest.approx(2 * base, rel=1e-12)
    t["copy_s_per_byte"] = 0.5e-9
    copy = time_s(t, count=250_000) - base
    over_copy = time_s(dict(t, cores_per_host=1), count=250_000) - over
    assert copy > 0 and over_copy == pytest.approx(2 * copy, rel=1e-9)


def test_a_woken_receiver_reduces_after_it_runs_again():
    # 2-rank ring all_reduce of n bytes, free port, reduction gamma: step 1 receives and reduces n/2
    # bytes, step 2 receives n/2. On 1 core (f = 2) each receive first waits wake + quantum, then the
    # reduction runs at half speed: 2 (wake + quantum) + (n/2) gamma more, not hidden behind the wait.
    n, gamma = 4000, 1e-9
    terms = dict(spin_s=10 * US, wake_s=3 * US, sched_quantum_s=40 * US, reduce_s_per_byte=gamma)
    base = time_s(dict(one_host(2), **terms), "all_reduce", "ring", n // 4)
    over = time_s(dict(one_host(2), cores_per_host=1, **terms), "all_reduce", "ring", n // 4)
    assert over - base == pytest.approx(2 * 43 * US + (n / 2) * gamma, rel=1e-9)


def test_receiver_sleeps_after_its_spin_window():
    # The message's first bytes arrive op + L = 1 + 5 us after the receiver entered its step.
    costs = dict(op_overhead_s=1 * US, wake_s=7 * US)
    plain = time_s(one_host(2, op_overhead_s=1 * US))
    spinning = time_s(one_host(2, spin_s=6.5 * US, **costs))
    asleep = time_s(one_host(2, spin_s=5.5 * US, **costs))
    assert spinning == pytest.approx(plain, rel=1e-12)
    assert asleep - plain == pytest.approx(7 * US, rel=1e-9)


def two_hosts(latency_s=5 * US, **extra):
    """2 ranks on 2 hosts, one NIC each; transfers cost their latency only."""
    t = uniform(2)
    t.update(host_of=[0, 1], nic_of=[0, 0], inter_latency_s=latency_s, nic_Bps=1e18, reduce_s_per_byte=0.0, **extra)
    return t


def test_tcp_wait_spins_its_own_window_and_yields():
    # commlib's TCP wait polls COMMLIB_TCP_SPIN_US (inter_spin_s), offering the core between polls;
    # shared-memory waits spin COMMLIB_SPIN_US (spin_s). The message arrives op + L = 1 + 5 us in.
    costs = dict(op_overhead_s=1 * US, wake_s=7 * US, spin_s=2 * US)
    plain = time_s(two_hosts(op_overhead_s=1 * US))
    assert time_s(two_hosts(**costs)) - plain == pytest.approx(7 * US, rel=1e-9)  # unset: spin_s, asleep
    assert time_s(two_hosts(inter_spin_s=6.5 * US, **costs)) == pytest.approx(plain, rel=1e-12)
    assert time_s(two_hosts(inter_spin_s=5.5 * US, **costs)) - plain == pytest.approx(7 * US, rel=1e-9)
    # On one host the inter-host spin does not apply.
    assert time_s(one_host(2, inter_spin_s=6.5 * US, **costs)) - time_s(one_host(2, op_overhead_s=1 * US)) == \
        pytest.approx(7 * US, rel=1e-9)
    # Oversubscribed (host 1: 2 ranks on 1 core): a yielding poller is not asleep, so within its spin
    # it pays its turn for a core but not the wake-up.
    t = two_hosts(**costs, cores_per_host=1, sched_quantum_s=40 * US)
    t.update(host_of=[0, 1, 1], nic_of=[0, 0, 0])
    base = dict(t, cores_per_host=0, wake_s=0.0, sched_quantum_s=0.0)
    yielding = _C.simulate(_C.Collective.broadcast, "binomial", 2, 4, 0, dict(t, inter_spin_s=1000 * US))["time_s"]
    asleep = _C.simulate(_C.Collective.broadcast, "binomial", 2, 4, 0, t)["time_s"]
    free = _C.simulate(_C.Collective.broadcast, "binomial", 2, 4, 0, base)["time_s"]
    assert asleep - yielding == pytest.approx(7 * US, rel=1e-9)
    assert yielding > free


def test_wake_up_overlaps_a_long_transfer():
    # 1 MB at 1 GB/s takes 1000 us: the receiver woken 7 us after the first bytes is running long before
    # the last, so a bandwidth-bound message costs nothing more.
    t = one_host(2, wake_s=7 * US)
    t["intra_port_Bps"] = 1e9
    plain = dict(t, wake_s=0.0)
    assert time_s(t, count=250_000) == pytest.approx(time_s(plain, count=250_000), rel=1e-12)


def test_presets_have_no_scheduling_terms():
    # Presets (a GPU per rank, or a CPU host per rank) keep their pinned results: all terms off.
    for name in ("dgx-h100", "dgx-a100", "eth-25g", "eth-100g"):
        d = load(name).engine_dict(16)
        assert (d["cores_per_host"], d["sched_quantum_s"], d["spin_s"], d["wake_s"]) == (0, 0.0, 0.0, 0.0), name


def test_bad_scheduling_fields_are_named(tmp_path):
    p = tmp_path / "t.json"
    p.write_text('{"base": "eth-25g", "cores_per_host": -1}')
    with pytest.raises(TopologyError, match="cores_per_host"):
        load(str(p))
    p.write_text('{"base": "eth-25g", "cores_per_host": 1.5}')
    with pytest.raises(TopologyError, match="cores_per_host"):
        load(str(p))
    p.write_text('{"base": "eth-25g", "wake_us": -3}')
    with pytest.raises(TopologyError, match="wake_us"):
        load(str(p))
    with pytest.raises(ValueError, match="spin_s"):
        _C.simulate(_C.Collective.broadcast, "binomial", 2, 4, 0, one_host(2, spin_s=-1.0))


def _netns_like(quantum_us, wake_us=0.0):
    """2 hosts x 2 ranks on 1 core per host, 1 Gb/s between hosts: the shape of the netns runs."""
    return sim.Topology(name="synthetic", devices_per_host=2, intra_latency_us=0.0, intra_GBps=10.0,
                        nics=1, nic_Gbps=1.0, inter_latency_us=16.0, call_overhead_us=12.0, cores_per_host=1,
                        sched_quantum_us=quantum_us, wake_us=wake_us, spin_us=20.0)


def test_fit_recovers_a_known_quantum_from_synthetic_rows():
    truth = _netns_like(83.0)
    rows = [{"collective": "all_reduce", "algorithm": alg, "bytes": b, "world_size": 4, "dtype": "float32",
             "time_us": {"median": sim.predict("all_reduce", alg, b, 4, truth)["time_us"]["median"]}}
            for alg in ("ring", "hierarchical") for b in (8, 64, 512, 4096)]
    got = fit_sched.fit_monotone(rows, lambda v: dataclasses.replace(truth, sched_quantum_us=v), max_bytes=4096)
    assert got == pytest.approx(83.0, rel=1e-6)
    # the same rows with the term's contribution removed fit 0: the estimate is the term, nothing else
    zero = [dict(r, time_us={"median": sim.predict("all_reduce", r["algorithm"], r["bytes"], 4,
                                                   _netns_like(0.0))["time_us"]["median"]}) for r in rows]
    assert fit_sched.fit_monotone(zero, lambda v: dataclasses.replace(truth, sched_quantum_us=v),
                                max_bytes=4096) == pytest.approx(0.0, abs=1e-6)


def test_scheduling_fields_round_trip_through_json(tmp_path):
    t = _netns_like(97.0, wake_us=3.0)
    p = tmp_path / "t.json"
    p.write_text(__import__("json").dumps(t.as_json()))
    back = load(str(p))
    assert back == t and back.engine_dict(4)["sched_quantum_s"] == pytest.approx(97e-6)
    assert "1 cores per host, spin 20 us, wake-up 3 us, quantum 97 us" in t.describe()


def _bench_file(tmp_path, truth, sizes, cores):
    """Bench rows the simulator predicts on `truth` at each world size (a noiseless machine)."""
    recs = []
    for P in sizes:
        for coll, alg in (("all_reduce", "ring"), ("all_reduce", "recursive_doubling"), ("all_to_all", "pairwise")):
            for k in range(3, 22, 2):
                recs.append(dict(sim.predict(coll, alg, 1 << k, P, truth), backend="commlib", transport="shm"))
    path = tmp_path / "bench.json"
    path.write_text(__import__("json").dumps({"machine": {"cores": cores}, "results": recs}))
    return str(path)


def test_fitted_topology_recovers_cores_and_quantum(tmp_path):
    # A 2-core machine measured at 2 ranks (fits the rates) and 4 ranks (beyond the cores).
    truth = sim.Topology(name="truth", devices_per_host=64, intra_latency_us=1.0, call_overhead_us=2.0,
                         intra_GBps=8.0, reduce_GBps=20.0, copy_GBps=12.0, cores_per_host=2, spin_us=20.0,
                         sched_quantum_us=6.0)
    path = _bench_file(tmp_path, truth, (2, 4), cores=2)
    t = sim.from_bench(path, world_size=2)
    assert (t.cores_per_host, t.spin_us, t.wake_us) == (2, 20.0, 0.0)
    assert t.sched_quantum_us == pytest.approx(6.0, rel=1e-6)
    assert "at 4 ranks" in t.sources["sched_quantum_us"]
    # the fitted host holds the file's largest world size, predicted as the truth's; more is a clear error
    assert t.devices_per_host == 4
    got = sim.predict("all_reduce", "ring", 64, 4, t)["time_us"]["median"]
    assert got == pytest.approx(sim.predict("all_reduce", "ring", 64, 4, truth)["time_us"]["median"], rel=1e-6)
    with pytest.raises(ValueError, match="ranks: 8 needs 2 hosts, but fitted:bench.json is one host of 4 ranks"):
        sim.predict("all_reduce", "ring", 64, 8, t)


def test_fitted_topology_without_cores_or_beyond_them_has_no_scheduling(tmp_path):
    truth = sim.Topology(name="truth", devices_per_host=64, intra_latency_us=1.0, call_overhead_us=2.0,
                         intra_GBps=8.0, reduce_GBps=20.0, copy_GBps=12.0)
    # fitted at 4 ranks on 2 cores (the default: the largest world size): sharing is inside its rates
    t = sim.from_bench(_bench_file(tmp_path, truth, (2, 4), cores=2))
    assert (t.cores_per_host, t.sched_quantum_us) == (0, 0.0)
    # cores known, no run beyond them: cores_per_host set, no quantum to fit
    t = sim.from_bench(_bench_file(tmp_path, truth, (2,), cores=2))
    assert (t.cores_per_host, t.sched_quantum_us) == (2, 0.0) and "no run" in t.sources["sched_quantum_us"]
