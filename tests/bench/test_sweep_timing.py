"""The sweep's timing rule (commlib/bench/sweep.py) is one rule for every backend: calls back to back
after a barrier in each round, a call's time the slowest rank's duration of that call, the row's
time the median over calls, the loop average the slowest rank's loop time over the calls. Two
simulated ranks in one process with a scripted clock, one run under commlib's name and one under
MPI's: the same durations must give the same record (issue #42's question whether the main job and
the 3-pass bench time MPI and commlib alike, bench/RESULTS_collectives.md session 20)."""
import io
import os
import subprocess
import sys

import numpy as np
import pytest

from commlib.bench import sweep as sweep_mod
from commlib.bench.backends import Backend
from commlib.perf import common as C

# Rank 0's duration of each call, in seconds, cycling (warm-ups and timed calls alike). Rank 1's
# timed calls take rank 0's durations in reverse order within each round, so the slowest rank
# differs from call to call and the max is not either rank's own series.
DURATIONS = [100e-6, 500e-6, 120e-6, 90e-6, 900e-6, 110e-6, 95e-6]


class FakeClock:
    def __init__(self):
        self.now = 0.0

    def __call__(self):
        return self.now


class ScriptedBackend(Backend):
    """Rank 0 of two: each call advances the fake clock by the next scripted duration; rank 1's
    numbers are made up in gather_stats from rank 0's."""

    transport = "shm"
    rank, size = 0, 2

    def __init__(self, name, clock):
        self.name, self.clock = name, clock
        self.calls = 0
        self.events = []  # "call" / "barrier", in order
        self.rounds_seen = []

    def algorithms(self, collective):
        return ["scripted"] if self.name == "commlib" else [self.name]

    def make(self, collective, algorithm, mode, bufs, op, root):
        def call():
            self.clock.now += DURATIONS[self.calls % len(DURATIONS)]
            self.calls += 1
            self.events.append("call")
        return call

    def barrier(self):
        self.events.append("barrier")

    def gather_stats(self, vec):
        v = np.asarray(vec, np.float64)
        if v.size == 1:  # the warm-up estimates: both ranks alike
            return np.stack([v, v])
        # per shape: n call times, the loop time, #wrong, CPU seconds, voluntary and involuntary
        # switches (one shape here); rank 1 used what rank 0 did
        n = v.size - 5
        other = v.copy()
        other[:n] = v[:n][::-1]
        other[n] = v[n] * 1.5  # rank 1's loop took longer: the loop average is the slowest rank's
        return np.stack([v, other])


def run(name, monkeypatch, iters=12, rounds=3):
    clock = FakeClock()
    monkeypatch.setattr(sweep_mod.time, "perf_counter", clock)
    b = ScriptedBackend(name, clock)
    # this process's usage so far: each call 1 ms of CPU, one sleep and two preemptions
    monkeypatch.setattr(sweep_mod, "_usage", lambda: np.array([1e-3, 1, 2], np.float64) * b.calls)
    cfg = {"collectives": ["broadcast"], "sizes": [1 << 20], "dtype": "float32", "op": "sum", "root": 0,
           "iters": iters, "min_time": 0.0, "max_iters": iters, "warmup": 2, "check": False,
           "rounds": rounds, "modes": [C.COMPARE_MODE["broadcast"]], "algorithms": ["all"]}
    s = sweep_mod.Sweep(b, cfg, out=io.StringIO())
    recs = s.run()
    assert len(recs) == 1
    return recs[0], b


@pytest.mark.parametrize("name", ["commlib", "mpi"])
def test_a_calls_time_is_its_slowest_rank_and_the_row_the_median(name, monkeypatch):
    rec, b = run(name, monkeypatch)
    n = rec["iters"]
    assert n == 12 and rec["rounds"] == 3
    # replay rank 0's timed calls: after 2 + 20 warm-ups (the job's first shape), each round has
    # one re-warm call (rounds after the first), then n / rounds timed calls
    k = 2 + 20
    mine = []
    for rnd in range(3):
        k += 1 if rnd else 0
        mine += [DURATIONS[(k + j) % len(DURATIONS)] for j in range(n // 3)]
        k += n // 3
    mine = np.array(mine)
    theirs = mine[::-1]
    per_call = np.maximum(mine, theirs)
    assert rec["time_us"]["median"] == pytest.approx(np.median(per_call) * 1e6)
    assert rec["time_us"]["min"] == pytest.approx(per_call.min() * 1e6)
    assert rec["time_us"]["max"] == pytest.approx(per_call.max() * 1e6)
    assert rec["time_us"]["loop_avg"] == pytest.approx(mine.sum() * 1.5 / n * 1e6)
    # usage over the timed loops only (not the warm-ups or re-warm calls), both ranks' summed, per call
    assert rec["cpu_us"] == pytest.approx(2 * 1e3)
    assert rec["switches"] == pytest.approx({"voluntary": 2.0, "involuntary": 4.0})


@pytest.mark.parametrize("name", ["commlib", "mpi"])
def test_calls_run_back_to_back_after_one_barrier_per_round(name, monkeypatch):
    _, b = run(name, monkeypatch)
    ev = "".join("b" if e == "barrier" else "c" for e in b.events)
    # warm-ups, then per round: (a re-warm call after the first round) a barrier, 4 timed calls
    assert ev == "c" * 22 + "b" + "c" * 4 + "cb" + "c" * 4 + "cb" + "c" * 4


def test_commlib_and_mpi_rows_are_timed_by_the_same_rule(monkeypatch):
    a, _ = run("commlib", monkeypatch)
    m, _ = run("mpi", monkeypatch)
    assert a["time_us"] == m["time_us"] and a["iters"] == m["iters"] and a["rounds"] == m["rounds"]
    assert a["cpu_us"] == m["cpu_us"] and a["switches"] == m["switches"]


class SameJobScripted(ScriptedBackend):
    """commlib's two algorithms with MPI's series in the same processes (same_job.SameJobBackend's
    hooks); every call records whose it was."""

    def __init__(self, clock):
        super().__init__("commlib", clock)
        self.whose = []

    def algorithms(self, collective):
        return ["ring", "direct"]

    def peers_inline(self, collective):
        return ["mpi"]

    def runs(self, collective, algorithm, mode, op, dtype):
        return algorithm != "mpi" or mode == C.COMPARE_MODE[collective]

    def backend_of(self, algorithm):
        return "mpi" if algorithm == "mpi" else "commlib"

    def make(self, collective, algorithm, mode, bufs, op, root):
        inner = super().make(collective, algorithm, mode, bufs, op, root)

        def call():
            self.whose.append(f"{algorithm}/{mode}")
            inner()
        return call

    def barrier(self):
        super().barrier()
        self.whose.append("|")

    def gather_stats(self, vec):
        v = np.asarray(vec, np.float64)
        return np.stack([v, v])


def test_an_inline_peer_takes_its_turn_in_every_round_beside_each_algorithm(monkeypatch):
    """Issue #42: a slow spell must hit commlib's algorithms and MPI alike, so MPI's calls are one
    more series of every round at each size, in its comparison mode only, and its records are MPI's."""
    clock = FakeClock()
    monkeypatch.setattr(sweep_mod.time, "perf_counter", clock)
    b = SameJobScripted(clock)
    monkeypatch.setattr(sweep_mod, "_usage", lambda: np.zeros(3))
    rounds, iters = 3, 6
    cfg = {"collectives": ["all_reduce"], "sizes": [1 << 20], "dtype": "float32", "op": "sum", "root": 0,
           "iters": iters, "min_time": 0.0, "max_iters": iters, "warmup": 1, "check": False,
           "rounds": rounds, "modes": ["out", "in"], "algorithms": ["all"]}
    s = sweep_mod.Sweep(b, cfg, out=io.StringIO())
    recs = s.run()
    keys = ["ring/out", "ring/in", "direct/out", "direct/in", "mpi/in"]  # MPI: all_reduce in place only
    assert s.order == [keys]
    # after the warm-ups: per round, each key once, in the round's own order (round_order: listed
    # in the first round): (a re-warm call after the first round), a barrier, iters/rounds timed calls
    taken = [[f"{a}/{m}" for a, m in sweep_mod.round_order([tuple(k.split("/")) for k in keys], "all_reduce",
                                                             1 << 20, rnd)] for rnd in range(rounds)]
    assert s.round_orders == [taken] and taken[0] == keys
    assert all(sorted(t) == sorted(keys) for t in taken) and len({tuple(t) for t in taken}) > 1
    expected = []
    for rnd in range(rounds):
        for k in taken[rnd]:
            expected += ([k] if rnd else []) + ["|"] + [k] * (iters // rounds)
    assert b.whose[-len(expected):] == expected
    assert "|" not in b.whose[:-len(expected)]  # the warm-ups come first, without barriers
    by = {(r["backend"], r["algorithm"], r["mode"]) for r in recs}
    assert by == {("commlib", "ring", "out"), ("commlib", "ring", "in"), ("commlib", "direct", "out"),
                  ("commlib", "direct", "in"), ("mpi", "mpi", "in")}
    assert all(r["iters"] == iters and r["rounds"] == rounds for r in recs)
    # the size's rounds' wall clock, one span for every series of the size
    assert len({tuple(r["at"]) for r in recs}) == 1 and recs[0]["at"][0] <= recs[0]["at"][1]


def test_every_rank_takes_a_round_in_the_same_order_and_no_series_always_follows_one():
    """The rounds' orders are a function of (collective, size, round) alone, the same in every rank
    process whatever its hash seed; over the rounds a series follows several different ones."""
    keys = [(a, m) for a in ("ring", "direct", "bruck", "rail_ring", "auto") for m in ("out", "in")]
    script = ("import sys; from commlib.bench.sweep import round_order; "
              "print([round_order(%r, 'all_gather', 1 << 24, r) for r in range(4)])" % (keys,))
    outs = {subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60, check=True,
                           env=dict(os.environ, PYTHONHASHSEED=seed, PYTHONPATH=os.getcwd())).stdout
            for seed in ("1", "2")}
    assert len(outs) == 1
    orders = [sweep_mod.round_order(keys, "all_gather", 1 << 24, r) for r in range(4)]
    assert orders[0] == keys and all(sorted(o) == sorted(keys) for o in orders)
    follows = {}
    for o in orders:
        for before, after in zip(o, o[1:]):
            follows.setdefault(after, set()).add(before)
    assert all(len(follows.get(k, ())) >= 2 for k in keys[1:])
    assert sweep_mod.round_order(keys, "all_gather", 1 << 23, 1) != orders[1]  # each size its own
