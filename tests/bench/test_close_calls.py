"""commlib bench --close-rounds (commlib/bench/close_calls.py, commlib/bench/sweep.py): a verdict a
10% move of one series would turn (T5, Open MPI against auto and against commlib's best row) gets
more interleaved rounds for the series deciding it, and only those; a verdict far from its threshold
costs nothing more."""
import io

import numpy as np
import pytest

from commlib.bench import sweep as sweep_mod
from commlib.bench.backends import Backend
from commlib.bench.close_calls import close_series


def test_auto_running_the_clear_best_is_not_close():
    assert close_series({"ring": 100.0, "direct": 200.0, "auto": 101.0}, "ring") == set()


def test_a_t5_miss_one_margin_from_passing_is_close_and_names_its_series():
    # auto runs ring; direct is best, auto's row 1.14x direct: a miss that a 10% move of auto's
    # row, or of direct's, turns; ring's own row moving turns nothing, but it is what auto runs:
    # it gets the rounds too (T5' compares it with the best)
    got = close_series({"ring": 110.0, "direct": 95.0, "tree": 300.0, "auto": 108.0}, "ring")
    assert got == {"auto", "ring", "direct"}


def test_a_clear_t5_miss_and_a_clear_pass_are_not_close():
    assert close_series({"ring": 200.0, "direct": 100.0, "auto": 200.0}, "ring") == set()
    assert close_series({"ring": 100.0, "direct": 140.0, "auto": 100.0}, "ring") == set()


def test_open_mpi_within_a_margin_of_auto_is_close_either_side():
    # ring is auto's algorithm and commlib's best row: both verdicts are close, and ring's own row
    # decides the summary's (Open MPI over commlib's best)
    meds = {"ring": 100.0, "direct": 300.0, "auto": 100.0}
    assert close_series(dict(meds, mpi=103.0), "ring", "mpi") == {"auto", "mpi", "ring"}
    assert close_series(dict(meds, mpi=95.0), "ring", "mpi") == {"auto", "mpi", "ring"}
    assert close_series(dict(meds, mpi=150.0), "ring", "mpi") == set()
    assert close_series(dict(meds, mpi=50.0), "ring", "mpi") == set()  # a clear loss: more calls change nothing


def test_open_mpi_within_a_margin_of_commlibs_best_row_is_close_though_far_from_auto():
    # session 42's all_to_all 8 MiB: auto (running direct) 1416 us, direct's own row 1505, Open MPI
    # 1487: the summary divides by direct's row, which must get the rounds too
    got = close_series({"direct": 1505.0, "pairwise": 1900.0, "auto": 1416.0, "mpi": 1487.0}, "direct", "mpi")
    assert got == {"direct", "auto", "mpi"}
    # auto far ahead of Open MPI, commlib's best row close to it: the best row and the peer
    got = close_series({"direct": 1505.0, "pairwise": 1900.0, "auto": 1200.0, "mpi": 1487.0}, "direct", "mpi")
    assert got == {"direct", "mpi"}
    # a second algorithm one margin from taking the best row's place decides it too
    got = close_series({"direct": 1505.0, "pairwise": 1560.0, "auto": 1200.0, "mpi": 1487.0}, "direct", "mpi")
    assert got == {"direct", "pairwise", "mpi"}
    # far on every verdict: nothing
    assert close_series({"direct": 1000.0, "pairwise": 1900.0, "auto": 1000.0, "mpi": 1487.0}, "direct", "mpi") == set()


def test_autos_own_path_is_a_candidate_timed_by_autos_row():
    # broadcast's flag calls: no named algorithm runs them; T5 (bench/targets.py) counts auto's row
    # as that path's: shared 1.14x faster is a close miss, flags far ahead is not close
    assert close_series({"binomial": 100.0, "shared": 95.0, "auto": 108.0}, "flags") == {"auto", "shared", "flags"}
    assert close_series({"binomial": 300.0, "shared": 200.0, "auto": 100.0}, "flags") == set()
    assert close_series({"binomial": 300.0, "shared": 200.0}, "flags") == set()  # auto not measured


class FakeClock:
    def __init__(self):
        self.now = 0.0

    def __call__(self):
        return self.now


class PerSeriesBackend(Backend):
    """Two ranks alike in one process; each series' call advances the clock by its own duration;
    auto runs ring; MPI's series runs in the same rounds (same_job.py's hooks)."""

    name, transport, rank, size = "commlib", "shm", 0, 2

    def __init__(self, clock, durations):
        self.clock, self.durations = clock, durations
        self.whose = []

    def algorithms(self, collective):
        return ["ring", "direct", "auto"]

    def peers_inline(self, collective):
        return ["mpi"]

    def runs(self, collective, algorithm, mode, op, dtype):
        return True

    def resolve(self, collective, algorithm, size, dtype):
        return "ring" if algorithm == "auto" else algorithm

    def backend_of(self, algorithm):
        return "mpi" if algorithm == "mpi" else "commlib"

    def make(self, collective, algorithm, mode, bufs, op, root):
        def call():
            self.clock.now += self.durations[algorithm]
            self.whose.append(algorithm)
        return call

    def barrier(self):
        self.whose.append("|")

    def gather_stats(self, vec):
        v = np.asarray(vec, np.float64)
        return np.stack([v, v])


def _sweep(monkeypatch, durations, close_rounds=3, rounds=2, iters=4):
    clock = FakeClock()
    monkeypatch.setattr(sweep_mod.time, "perf_counter", clock)
    monkeypatch.setattr(sweep_mod, "_usage", lambda: np.zeros(3))
    b = PerSeriesBackend(clock, durations)
    cfg = {"collectives": ["all_reduce"], "sizes": [1 << 20], "dtype": "float32", "op": "sum", "root": 0,
           "iters": iters, "min_time": 0.0, "max_iters": iters, "warmup": 1, "check": False,
           "rounds": rounds, "close_rounds": close_rounds, "modes": ["in"], "algorithms": ["all"]}
    recs = sweep_mod.Sweep(b, cfg, out=io.StringIO()).run()
    return {r["algorithm"]: r for r in recs}, b


def test_a_close_mpi_verdict_gets_more_rounds_of_its_series_only(monkeypatch):
    recs, b = _sweep(monkeypatch, {"ring": 100e-6, "direct": 300e-6, "auto": 100e-6, "mpi": 103e-6})
    # after the two regular rounds (each: a barrier, 2 calls of every series), three more rounds of
    # auto, ring (commlib's best row) and MPI, interleaved as before: a re-warm call, a barrier, 2
    # calls each; every round in its own order (sweep.round_order); direct, far behind, gets none
    def order(names, rnd):
        return [a for a, _ in sweep_mod.round_order([(n, "in") for n in names], "all_reduce", 1 << 20, rnd)]
    regular = []
    for rnd in range(2):
        for k in order(("ring", "direct", "auto", "mpi"), rnd):
            regular += ([k] if rnd else []) + ["|"] + [k] * 2
    extra = []
    for rnd in range(3):
        for k in order(("ring", "auto", "mpi"), 2 + rnd):
            extra += [k, "|", k, k]
    assert b.whose[-len(regular + extra):] == regular + extra
    assert recs["auto"]["iters"] == recs["mpi"]["iters"] == recs["ring"]["iters"] == 4 + 6
    assert recs["auto"]["close_rounds"] == 3 and recs["auto"]["rounds"] == 5
    assert recs["direct"]["iters"] == 4 and "close_rounds" not in recs["direct"] and recs["direct"]["rounds"] == 2
    assert recs["mpi"]["backend"] == "mpi" and recs["auto"]["time_us"]["median"] == pytest.approx(100.0)


def test_far_verdicts_and_close_rounds_0_add_no_calls(monkeypatch):
    far = {"ring": 100e-6, "direct": 300e-6, "auto": 100e-6, "mpi": 250e-6}
    recs, b = _sweep(monkeypatch, far)
    assert all(r["iters"] == 4 and "close_rounds" not in r for r in recs.values())
    close = dict(far, mpi=103e-6)
    recs, b0 = _sweep(monkeypatch, close, close_rounds=0)
    assert all(r["iters"] == 4 and "close_rounds" not in r for r in recs.values())
    assert b0.whose.count("|") == 2 * 4  # the regular rounds' barriers only


def test_the_command_line_turns_close_rounds_on_by_default():
    import argparse
    from commlib.bench import arguments
    p = argparse.ArgumentParser()
    arguments.add_arguments(p)
    assert arguments.config_from_args(p.parse_args([]))["close_rounds"] == 8
    assert arguments.config_from_args(p.parse_args(["--close-rounds", "0"]))["close_rounds"] == 0


def test_the_report_says_how_many_rows_had_close_rounds(tmp_path):
    import json
    import os
    import sys
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import synth
    from commlib.bench import report
    d = synth.data(P=4, sizes=(8, 4096), collectives=("all_reduce",))
    d["config"]["close_rounds"] = 8
    for r in d["results"][:3]:
        r["close_rounds"] = 8
    (tmp_path / "a.json").write_text(json.dumps(d))
    report.generate(report.load([str(tmp_path / "a.json")]), str(tmp_path / "rep"))
    md = (tmp_path / "rep" / "report.md").read_text()
    assert "got 8 more rounds for the series deciding them: 3 rows" in md
