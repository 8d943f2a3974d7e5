"""The simulator's model beyond the closed forms: contention on shared links, chunk pipelining of
reductions, software overheads, auto resolution, and clear errors."""
import pytest

from commlib.sim import ranking
import commlib
import commlib._C as _C
from test_closed_forms import uniform
from commlib.core.call_spec import COLLECTIVE


def two_hosts(devices, nics, nic_Bps=1e9):
    P = 2 * devices
    t = uniform(P)
    t.update(host_of=[r // devices for r in range(P)], nic_of=[(r % devices) % nics for r in range(P)],
             nics_per_host=nics, intra_latency_s=0.0, inter_latency_s=0.0, intra_port_Bps=1e18, nic_Bps=nic_Bps,
             reduce_s_per_byte=0.0)
    return t


def test_shared_nic_serialises_transfers():
    # direct all_gather on 2 hosts x 2 devices: each rank sends its m bytes to the 2 remote ranks, so
    # a host's NICs carry 4m bytes out: 4m/B through one NIC, 2m/B each through two (rails).
    m = 1 << 20
    one = _C.simulate(_C.Collective.all_gather, "direct", m, 1, 0, two_hosts(2, 1))
    two = _C.simulate(_C.Collective.all_gather, "direct", m, 1, 0, two_hosts(2, 2))
    assert one["time_s"] == pytest.approx(4 * m / 1e9, rel=1e-9)
    assert two["time_s"] == pytest.approx(2 * m / 1e9, rel=1e-9)
    assert one["bytes_inter"] == 8 * m and one["bytes_intra"] == 4 * m
    # The accounting: the busiest NIC direction served those bytes, a port its rank's local m bytes.
    assert one["nic_busy_s"] == pytest.approx(4 * m / 1e9, rel=1e-9) and two["nic_busy_s"] == pytest.approx(2 * m / 1e9)
    assert one["port_busy_s"] == pytest.approx(m / 1e18, rel=1e-9) and one["cpu_busy_s"] == 0.0
    t = two_hosts(2, 2)
    t.update(send_overhead_s=1e-6, recv_overhead_s=2e-6)  # 3 sends and 3 receives a rank
    assert _C.simulate(_C.Collective.all_gather, "direct", m, 1, 0, t)["cpu_busy_s"] == pytest.approx(9e-6, rel=1e-9)


def test_chunks_overlap_reduction_with_transfer():
    # 2-rank ring all_reduce: one recv_reduce of n/2 bytes, then one recv of n/2 bytes.
    n, chunk = 1 << 20, 64 << 10
    t = uniform(2)
    beta, gamma, alpha = 1 / t["intra_port_Bps"], t["reduce_s_per_byte"], t["intra_latency_s"]
    whole = _C.simulate(_C.Collective.all_reduce, "ring", n // 4, 4, 0, t)["time_s"]
    assert whole == pytest.approx(2 * alpha + (n / 2) * (beta + gamma) + (n / 2) * beta, rel=1e-12)
    t["chunk_bytes"] = chunk
    k = (n / 2) / chunk
    piped = _C.simulate(_C.Collective.all_reduce, "ring", n // 4, 4, 0, t)["time_s"]
    reduce_step = chunk * (beta + gamma) + (k - 1) * chunk * max(beta, gamma)
    assert piped == pytest.approx(2 * alpha + reduce_step + (n / 2) * beta, rel=1e-12)
    assert piped < whole


def test_overheads_are_added_per_op_and_step():
    t = uniform(8)
    base = _C.simulate(_C.Collective.all_reduce, "ring", 0, 4, 0, t)["time_s"]
    t["op_overhead_s"], t["step_overhead_s"] = 1e-6, 0.5e-6
    more = _C.simulate(_C.Collective.all_reduce, "ring", 0, 4, 0, t)["time_s"]
    steps = 2 * 7
    assert more - base == pytest.approx(steps * 1e-6 + (steps - 1) * 0.5e-6, rel=1e-9)


def test_every_registered_algorithm_runs():
    t = uniform(6)
    for coll in ("all_reduce", "all_gather", "reduce_scatter", "all_to_all", "broadcast", "reduce",
                 "gather", "scatter", "barrier"):
        # Built-ins only (algorithms registered from Python: tests/schedule/test_user_algorithm.py).
        for alg in [a["name"] for a in _C.algorithm_info(COLLECTIVE[coll]) if "user_defined" not in a["traits"]]:
            out = _C.simulate(COLLECTIVE[coll], alg, 0 if coll == "barrier" else 1000, 4, 5 if coll in (
                "broadcast", "reduce", "gather", "scatter") else 0, t)
            assert out["time_s"] > 0 and out["algorithm"] == alg, (coll, alg)


def test_auto_resolves_to_a_registered_algorithm():
    out = _C.simulate(_C.Collective.all_reduce, "auto", 1 << 20, 4, 0, uniform(8))
    assert out["algorithm"] in _C.algorithms(_C.Collective.all_reduce)


def test_bad_arguments_name_the_field():
    t = uniform(4)
    with pytest.raises(ValueError, match="^algorithm: unknown all_reduce algorithm 'nope'"):
        _C.simulate(_C.Collective.all_reduce, "nope", 10, 4, 0, t)
    with pytest.raises(ValueError, match="^count:"):
        _C.simulate(_C.Collective.all_reduce, "ring", -1, 4, 0, t)
    with pytest.raises(ValueError, match="^root:"):
        _C.simulate(_C.Collective.broadcast, "binomial", 1, 4, 4, t)
    for field, value, msg in (("intra_port_Bps", 0.0, "must be a finite number > 0"),
                              ("nic_of", [0, 0, 0], "one entry per rank"),
                              ("chunk_bytes", -1, "must be >= 0"),
                              ("op_overhead_s", float("nan"), "must be a finite number >= 0")):
        bad = dict(t, **{field: value})
        with pytest.raises(ValueError, match=f"^topology.{field}: {msg}"):
            _C.simulate(_C.Collective.all_reduce, "ring", 10, 4, 0, bad)
    with pytest.raises(ValueError, match="^topology.extra: unknown field"):
        _C.simulate(_C.Collective.all_reduce, "ring", 10, 4, 0, dict(t, extra=1))
    with pytest.raises(ValueError, match="^topology.nic_Bps: missing"):
        _C.simulate(_C.Collective.all_reduce, "ring", 10, 4, 0, {k: v for k, v in t.items() if k != "nic_Bps"})


def test_auto_is_the_engines_choice_for_the_links(monkeypatch):
    """auto in the simulator resolves as a communicator with that topology as its cost model would
    (engine/auto_policy.h resolve_algorithm): the fastest candidate the model predicts when ranks
    span hosts; the override wins over everything (tests/sim/test_auto_model.py has the rest)."""
    from commlib import tuning
    monkeypatch.delenv("COMMLIB_ALGO_ALL_REDUCE", raising=False)
    _C.clear_tuning()
    try:
        t = two_hosts(2, 1)
        spanning = _C.simulate(_C.Collective.all_reduce, "auto", 1 << 20, 4, 0, t)
        best = ranking.tie_pick(_C.predict_candidates(_C.Collective.all_reduce, 1 << 20, 4, 0, t))
        assert (spanning["algorithm"], spanning["inter_algorithm"], spanning["intra_algorithm"]) == (best["algorithm"], best["inter_algorithm"], best["intra_algorithm"])
        one_host = dict(uniform(4), host_of=[0] * 4, nic_of=[0] * 4)
        assert (_C.simulate(_C.Collective.all_reduce, "auto", 1 << 20, 4, 0, one_host)["algorithm"] ==
                _C.choose_algorithm(_C.Collective.all_reduce, "auto", 4 << 20, 4))  # one host: the size policy
        monkeypatch.setenv("COMMLIB_ALGO_ALL_REDUCE", "ring")  # the override wins, as in the engine
        assert _C.simulate(_C.Collective.all_reduce, "auto", 1 << 20, 4, 0, t)["algorithm"] == "ring"
    finally:
        tuning.load_default()


def test_token_bucket_overlaps_latency_with_the_refill():
    """nic_burst_bytes (tc tbf): the bucket starts empty, so one message pays its bytes at the rate
    as before; in a ring of P steps the bucket refills while each step's latency passes, so the
    next step's bytes (up to the bucket) leave at once: P-1 steps of latency a and m bytes at rate
    1/b take (P-1) max(a, m b) + ..., not (P-1)(a + m b). The search's bound stays below it."""
    from test_closed_forms import ALPHA, BETA
    P, m = 4, 4096
    plain = dict(uniform(P), reduce_s_per_byte=0.0)
    bucket = dict(plain, nic_burst_bytes=float(1 << 20))
    one = {k: dict(v, host_of=[0, 1], nic_of=[0, 0]) for k, v in (("plain", plain), ("bucket", bucket))}
    assert (_C.simulate(_C.Collective.broadcast, "direct", m, 1, 0, one["bucket"])["time_s"] ==
            pytest.approx(_C.simulate(_C.Collective.broadcast, "direct", m, 1, 0, one["plain"])["time_s"], rel=1e-12))
    ring_plain = _C.simulate(_C.Collective.all_gather, "ring", m, 1, 0, plain)["time_s"]
    ring_bucket = _C.simulate(_C.Collective.all_gather, "ring", m, 1, 0, bucket)["time_s"]
    assert ring_plain == pytest.approx((P - 1) * (ALPHA + m * BETA), rel=1e-9)
    assert ring_bucket == pytest.approx(m * BETA + (P - 1) * ALPHA + (P - 2) * max(0.0, m * BETA - ALPHA), rel=1e-9)
    assert ring_bucket < ring_plain
    assert _C.candidate_lower_bound(_C.Collective.all_gather, "ring", m, 1, 0, bucket) <= ring_bucket
    with pytest.raises(ValueError, match="nic_burst_bytes"):
        _C.simulate(_C.Collective.all_gather, "ring", m, 1, 0, dict(plain, nic_burst_bytes=-1.0))


def exchange(steps):
    """A 2-rank all_reduce-shaped exchange of `count` elements in `steps` steps (no reduction: only
    its messages matter here)."""
    def build(rank, size, count, root):
        part = count // steps
        return {"steps": [[{"op": "send", "peer": 1 - rank, "src": ("input", k * part, part)},
                           {"op": "recv", "peer": 1 - rank, "dst": ("output", k * part, part)}] for k in range(steps)]}
    return build


def test_built_schedules_are_kept_exactly():
    """compact.h built_programs: a call simulated again takes its schedules built; a name registered
    again with another schedule is built anew (the registry's generation is in the key)."""
    d = dict(uniform(16), host_of=[r // 4 for r in range(16)])
    _C.clear_built_programs()
    first = _C.simulate(_C.Collective.all_reduce, "hierarchical", 4096, 4, 0, d, "ring", 0, "ring")
    again = _C.simulate(_C.Collective.all_reduce, "hierarchical", 4096, 4, 0, d, "ring", 0, "ring")
    assert not first["built_cached"] and again["built_cached"]
    same = lambda r: {k: v for k, v in r.items() if k not in ("build_s", "run_s", "built_cached")}  # noqa: E731
    assert same(first) == same(again)
    other = dict(d, host_of=[r // 8 for r in range(16)])
    assert not _C.simulate(_C.Collective.all_reduce, "hierarchical", 4096, 4, 0, other, "ring", 0, "ring")["built_cached"]
    times = []
    for steps in (1, 2):
        commlib.register_algorithm("all_reduce", "kept_exchange", exchange(steps))
        try:
            times.append(_C.simulate(_C.Collective.all_reduce, "kept_exchange", 8, 4, 0, uniform(2))["time_s"])
        finally:
            commlib.unregister_algorithm("all_reduce", "kept_exchange")
    assert times[1] == pytest.approx(times[0] + uniform(2)["inter_latency_s"], rel=1e-9)
