"""Fast tests of the bench pieces that need no ranks: arithmetic, table, fit, tuning, report."""
import io
import json
import os
import random
import re
import sys

import pytest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import synth  # noqa: E402
from commlib.perf import common as C  # noqa: E402
from commlib.perf import model as M  # noqa: E402
from commlib.bench import report, tuning  # noqa: E402
from commlib.perf import table
from commlib.core.call_spec import COLLECTIVE


# -- arithmetic ------------------------------------------------------------------------------------
def test_bus_factors():
    assert C.bus_factor("all_reduce", 4) == pytest.approx(1.5)
    assert C.bus_factor("all_reduce", 2) == pytest.approx(1.0)
    for c in ("all_gather", "reduce_scatter", "all_to_all"):
        assert C.bus_factor(c, 8) == pytest.approx(7 / 8)
    assert C.bus_factor("broadcast", 8) == 1.0
    algbw, busbw = C.bandwidths("all_reduce", 1_000_000, 4, 1e-3)
    assert algbw == pytest.approx(1.0) and busbw == pytest.approx(1.5)
    assert C.bandwidths("all_gather", 10, 2, 0.0) == (0.0, 0.0)


def test_sizes():
    assert C.parse_size("64M") == 64 << 20 and C.parse_size("8") == 8 and C.parse_size("1k") == 1024
    with pytest.raises(ValueError):
        C.parse_size("12X")
    s = C.size_list(8, 16 << 20, 4)
    assert s[0] == 8 and s[1] == 32 and s[-1] == 16 << 20 and s[-2] == 8 << 20
    assert C.size_list(8, 64, 2) == [8, 16, 32, 64]
    assert C.size_list(100, 400, step=100) == [100, 200, 300, 400]


def test_geometry_rounds_to_blocks():
    assert C.geometry("all_reduce", 8, "float32", 4) == (2, 2, 8)
    assert C.geometry("all_gather", 8, "float32", 4) == (4, 1, 16)
    assert C.geometry("reduce_scatter", 1 << 20, "float32", 4) == (262144, 65536, 1 << 20)
    assert C.core_bytes("all_gather", 1 << 20, "float32", 4) == 1 << 18
    assert C.core_bytes("all_reduce", 1 << 20, "float32", 4) == 1 << 20


def test_reference_values_are_exact_and_mismatches_counted():
    P, n = 5, 100
    exp = C.reduced(P, 0, n, "sum", "float32")
    manual = sum(C.values(r, 0, n, "sum", "float32") for r in range(P))
    assert (exp == manual).all()
    assert C.count_wrong(manual.astype("float32"), exp, "float32", "sum") == 0
    bad = manual.astype("float32")
    bad[3] += 1
    bad[50] = float("nan")
    assert C.count_wrong(bad, exp, "float32", "sum") == 2
    assert (C.reduced(3, 7, 10, "max", "int32") == max(C.values(r, 7, 10, "max", "int32").tolist()
                                                      for r in range(3))).any()


# -- table -------------------------------------------------------------------------------------------
def _rec(us, busbw=1.25, wrong=0):
    return {"time_us": {"median": us}, "algbw_GBps": busbw / 1.5, "busbw_GBps": busbw, "wrong": wrong}


def test_iteration_counts_follow_the_time_budget():
    from commlib.bench.sweep import iteration_counts
    cfg = {"iters": 20, "min_time": 0.02, "max_iters": 1000}
    # 1 us calls hit the cap, 100 us calls get 200, slow calls keep the minimum, and a zero
    # estimate (a clock that did not tick) keeps the minimum too.
    assert iteration_counts([1e-6, 1e-4, 0.5, 0.0], cfg) == [1000, 200, 20, 20]
    assert iteration_counts([1e-6], dict(cfg, min_time=0.0)) == [20]
    assert iteration_counts([1e-6], dict(cfg, max_iters=5)) == [20]  # -n wins over the cap


def test_table_format():
    h = table.header_lines()
    assert "out-of-place" in h[0] and "in-place" in h[0]
    for col in ("size", "count", "type", "redop", "root", "time", "algbw", "busbw", "#wrong"):
        assert col in h[1]
    row = table.format_row(1024, 256, "float32", "sum", -1, {"out": _rec(12.345), "in": _rec(11.5)},
                           algorithm="ring")
    f = row.split()
    assert f[:6] == ["1024", "256", "float32", "sum", "-1", "ring"]
    assert f[6:10] == ["12.35", "0.83", "1.25", "0"] and f[10] == "11.50"
    # the columns line up with the header
    assert len(row) == len(h[1]) and row.index(" 12.35") + 6 == h[1].index("time") + 4
    na = table.format_row(8, 2, "float32", "none", 0, {"in": _rec(3.0)})
    assert na.split()[5:9] == ["N/A"] * 4  # no algorithm name: the N/A columns follow root
    assert "WRONG" in table.format_row(8, 2, "float32", "sum", -1, {"out": _rec(3.0, wrong=2)})
    out = io.StringIO()
    t = table.Table("all_reduce", 4, out)
    t.header("commlib all_reduce ranks=4")
    t.row(8, 2, "float32", "sum", -1, {"out": _rec(1.0, 1.0), "in": _rec(1.0, 3.0)}, algorithm="ring")
    t.row(8, 2, "float32", "sum", -1, {"out": _rec(1.0, 4.0), "in": _rec(1.0, 4.0)}, algorithm="tree")
    assert t.footer() == pytest.approx(3.0)
    text = out.getvalue()
    assert "# Avg bus bandwidth    : 2.0000  ring" in text and "# Avg bus bandwidth    : 4.0000  tree" in text
    assert "# Out of bounds values : 0 OK" in text


# -- model ---------------------------------------------------------------------------------------------
def _samples(params, P, noise=0.0, colls=None):
    rnd = random.Random(1)
    out = []
    for coll, algs in synth.ALGOS.items():
        if colls and coll not in colls:
            continue
        for alg in algs:
            for n in (8, 256, 4096, 65536, 1 << 20, 16 << 20):
                t = M.predict(params, coll, alg, n, P) * (1 + noise * rnd.uniform(-1, 1))
                out.append((coll, alg, n, P, t))
    return out


@pytest.mark.parametrize("P", [2, 4, 7, 8])
def test_fit_recovers_known_parameters(P):
    true = dict(alpha=3e-6, beta=2e-10, gamma=7e-11)
    got = M.fit(_samples(true, P))
    for k in true:
        assert got[k] == pytest.approx(true[k], rel=1e-6)
    assert got["rel_err_median"] < 1e-9


def test_fit_with_noise_and_without_reductions():
    true = dict(alpha=5e-5, beta=1e-9, gamma=3e-10)
    got = M.fit(_samples(true, 4, noise=0.05))
    for k in true:
        assert got[k] == pytest.approx(true[k], rel=0.25)
    got = M.fit(_samples(true, 4, colls=("all_gather", "all_to_all")))
    assert got["alpha"] == pytest.approx(5e-5, rel=1e-6) and got["beta"] == pytest.approx(1e-9, rel=1e-6)
    assert got["gamma"] == 0.0


def test_model_formulas_match_design():
    P, n = 8, 1 << 20
    assert M.coefficients("all_reduce", "ring", n, P) == pytest.approx((14, 2 * 7 / 8 * n, 7 / 8 * n))
    assert M.coefficients("all_reduce", "recursive_doubling", n, P) == pytest.approx((3, 3 * n, 3 * n))
    assert M.coefficients("all_reduce", "rabenseifner", n, P) == pytest.approx((6, 2 * 7 / 8 * n, 7 / 8 * n))
    assert M.coefficients("all_to_all", "bruck", n, P) == pytest.approx((3, n / 2 * 3, 0))
    assert M.coefficients("all_to_all", "pairwise", n, P) == pytest.approx((7, 7 / 8 * n, 0))
    co = M.crossovers(dict(alpha=2e-6, beta=2.5e-10, gamma=1e-10), "all_reduce",
                      ["ring", "recursive_doubling"], 8)
    assert len(co) == 1 and co[0][1:] == ("recursive_doubling", "ring")


# -- tuning --------------------------------------------------------------------------------------------
class FakeCore:
    def __init__(self):
        self.calls = {}

    def set_tuning(self, coll, rows):
        self.calls[coll] = rows


def test_tuning_from_measurements_round_trips(tmp_path):
    d = synth.data(P=4, sizes=(8, 256, 4096, 65536, 1 << 20, 16 << 20))
    table = tuning.from_results(d["results"], d["model"])
    path = str(tmp_path / "tuning.json")
    tuning.write(path, table, d["machine"])
    back = tuning.read(path)
    assert back["schema"] == tuning.SCHEMA and back["collectives"] == json.loads(json.dumps(table["collectives"]))
    # every measured size picks an algorithm within 10% of the best measured there
    for r in report.comparison(d["results"]):
        pick = tuning.choose(back, r["collective"], C.core_bytes(r["collective"], r["bytes"], "float32", 4), 4)
        assert r["times"][pick] <= 1.10 * r["best_us"]
    assert back["collectives"]["all_reduce"]["4"]["source"] == "measured"
    assert back["collectives"]["all_reduce"]["3"]["source"].startswith("model")
    fake = FakeCore()
    assert set(tuning.install(back, core=fake)) == set(synth.ALGOS)
    rows = fake.calls["all_reduce"]
    assert all(isinstance(r[0], int) and isinstance(r[1], int) and isinstance(r[2], str) for r in rows)
    four = [r for r in rows if r[0] == 4]
    assert four[-1][1] == -1 and [r[1] for r in four[:-1]] == sorted(r[1] for r in four[:-1])


def test_tuning_path_ignores_noise_but_follows_real_crossovers():
    sizes = [{"a": 1.00, "b": 1.06}, {"a": 1.03, "b": 1.00}, {"a": 1.00, "b": 1.06},  # noise: keep a
             {"a": 2.0, "b": 1.0}, {"a": 4.0, "b": 1.5}]                             # real: b wins
    assert tuning.choose_path(sizes) == ["a", "a", "a", "b", "b"]
    assert tuning.choose_path([{"x": 1.0}]) == ["x"]
    # a size where the steady choice would be > 10% slow forces a switch
    assert tuning.choose_path([{"a": 1.0, "b": 1.05}, {"a": 1.2, "b": 1.0}, {"a": 1.0, "b": 1.05}]) \
        in (["b", "b", "b"], ["a", "b", "a"])


def test_tune_merges_runs_so_one_noisy_run_does_not_decide(tmp_path):
    # Five runs in which the best algorithm at 8 bytes leads the others by 10% or more; in one of them
    # it looks 3x slower (a slow spell). `commlib tune` judges each time against its own run's best,
    # capped at RATIO_CAP, so that run moves it by a bounded step and it stays the pick.
    import copy
    from commlib import cli
    runs = [synth.data(P=2, sizes=(8, 1 << 20), collectives=("all_reduce",)) for _ in range(5)]
    truth = tuning.from_results(runs[0]["results"], runs[0]["model"])
    best_small = tuning.choose(truth, "all_reduce", 8, 2)
    for d in runs:  # (synth's direct and recursive_doubling tie at 8 bytes: the pick leads by 10%)
        for r in d["results"]:
            if r["backend"] == "commlib" and r["algorithm"] not in (best_small, "auto") and r["bytes"] == 8:
                r["time_us"]["median"] *= 1.10
    noisy = copy.deepcopy(runs[1])
    for r in noisy["results"]:
        if r["backend"] == "commlib" and r["algorithm"] == best_small and r["bytes"] == 8:
            r["time_us"]["median"] *= 3
    assert tuning.choose(tuning.from_results(noisy["results"], noisy["model"]), "all_reduce", 8, 2) != best_small
    paths = []
    for i, d in enumerate([runs[0], noisy] + runs[2:]):
        paths.append(str(tmp_path / f"run{i}.json"))
        with open(paths[-1], "w") as f:
            json.dump(d, f)
    out = str(tmp_path / "tuning.json")
    assert cli.main(["tune", *paths, "-o", out]) == 0
    merged = tuning.read(out)
    assert merged["collectives"]["all_reduce"]["2"]["source"] == "measured"
    assert tuning.choose(merged, "all_reduce", 8, 2) == best_small


def test_tune_judges_each_time_against_its_own_runs_best():
    # Run 2 is a slow spell of the whole machine (every time 1.7x): merged raw medians would compare
    # a's fast-spell times with b's slow-spell ones; ratios within each run do not.
    from commlib.bench import tuning_picks
    def rec(alg, us, run):
        return {"backend": "commlib", "collective": "all_reduce", "world_size": 4, "bytes": 1024, "dtype": "float32",
                "algorithm": alg, "mode": "in", "run": run, "time_us": {"median": us}}
    recs = [rec("a", 10.0, 0), rec("b", 10.5, 0), rec("a", 17.0, 1), rec("b", 17.85, 1),
            rec("a", 10.0, 2), rec("b", 10.5, 2)]
    rel = tuning_picks.relative_times(recs)[("all_reduce", 4, 1024)]
    assert rel["a"] == pytest.approx(1.0) and rel["b"] == pytest.approx(1.05)
    # a 3x spell of a counts as RATIO_CAP, not 3x
    rel = tuning_picks.relative_times(recs + [rec("a", 30.0, 3), rec("b", 10.0, 3)])[("all_reduce", 4, 1024)]
    assert rel["a"] == pytest.approx(tuning_picks.RATIO_CAP ** 0.25)


def test_tune_without_output_writes_the_current_directory(tmp_path, monkeypatch):
    from commlib import cli
    shipped = tuning.default_path()
    before = open(shipped).read() if os.path.exists(shipped) else None
    run = tmp_path / "run.json"
    run.write_text(json.dumps(synth.data(P=2, sizes=(8, 1 << 20), collectives=("all_reduce",))))
    monkeypatch.chdir(tmp_path)
    assert cli.main(["tune", str(run)]) == 0
    assert tuning.read(str(tmp_path / "tuning.json"))["collectives"]["all_reduce"]["2"]["source"] == "measured"
    assert (open(shipped).read() if os.path.exists(shipped) else None) == before


def test_tuning_installs_into_the_core(tmp_path):
    import commlib._C as _C
    d = synth.data(P=4, sizes=(8, 4096, 1 << 20))
    table = tuning.from_results(d["results"], d["model"])
    try:
        tuning.install(table)
        for r in report.comparison(d["results"]):
            b = C.core_bytes(r["collective"], r["bytes"], "float32", 4)
            assert _C.choose_algorithm(COLLECTIVE[r["collective"]], "auto", b, 4) == tuning.choose(table, r["collective"], b, 4)
    finally:
        for coll in synth.ALGOS:
            _C.set_tuning(COLLECTIVE[coll], [])
        tuning.load_default()


def test_default_tuning_file_is_valid():
    path = tuning.default_path()
    if not os.path.exists(path):
        pytest.skip("no commlib/core/tuning.json yet")
    t = tuning.read(path)
    assert t is not None
    for coll in t["collectives"]:
        rows = tuning.rows_for(t, coll)
        assert rows and all(isinstance(a, str) for _, _, a in rows)


# -- report --------------------------------------------------------------------------------------------
SECTIONS = ("Summary: commlib vs gloo vs MPI", "Plots", "Fitted cost model", "Crossover sizes",
            "What auto picks", "commlib vs gloo vs MPI at each size", "Correctness", "Machine and versions")


def test_report_from_synthetic_json(tmp_path):
    d = synth.data(P=4)
    d2 = synth.data(P=2, mpi=False)
    f1, f2 = tmp_path / "a.json", tmp_path / "b.json"
    f1.write_text(json.dumps(d))
    f2.write_text(json.dumps(d2))
    out = tmp_path / "rep"
    out.mkdir()
    (out / "busbw_P16.png").write_bytes(b"from an earlier run")
    (out / "notes.png").write_bytes(b"not ours")
    datas = report.load([str(f1), str(f2)])
    path = report.generate(datas, str(out))
    assert not (out / "busbw_P16.png").exists() and (out / "notes.png").exists()
    html = open(path).read()
    md = (out / "report.md").read_text()
    for s in SECTIONS:
        assert s in html and s in md
    for P in (2, 4):
        for kind in ("busbw", "latency", "model"):
            assert (out / f"{kind}_P{P}.png").stat().st_size > 1000
            assert f"({kind}_P{P}.png)" in md
    assert html.count("data:image/png;base64,") == 6
    for coll in synth.ALGOS:  # every collective has a panel and a comparison table
        assert f"### {coll}, 4 ranks" in md
    assert "gloo / commlib" in md and "MPI / commlib" in md
    assert "1/beta (GB/s)" in md and "auto within 10% of the best" in md


def test_report_says_mpi_not_available(tmp_path):
    d = synth.data(P=2, sizes=(8, 1024), collectives=("all_reduce",), mpi=False)
    report.generate([d], str(tmp_path))
    md = (tmp_path / "report.md").read_text()
    assert "MPI: not available (mpi4py not importable (synthetic))" in md
    out = io.StringIO()
    report.print_summary(d, out)
    assert "MPI: not available" in out.getvalue()


def test_json_schema_validation():
    d = synth.data(P=2, sizes=(8, 64))
    assert report.validate(d) == []
    assert report.validate(json.loads(json.dumps(d))) == []
    bad = dict(d, results=[{"backend": "commlib"}])
    assert any("lacks" in e for e in report.validate(bad))
    assert report.validate({"schema": "x"})


def test_cli_parses_the_readme_command():
    from commlib.bench.launcher import config_from_args
    from commlib.cli import parser
    a = parser().parse_args(["bench", "all_reduce", "--np", "4", "-b", "8", "-e", "64M", "-f", "4",
                             "--algorithms", "ring,auto", "--peers", "gloo,mpi", "--json", "x.json"])
    cfg = config_from_args(a)
    assert cfg["collectives"] == ["all_reduce"] and cfg["sizes"][-1] == 64 << 20
    assert cfg["algorithms"] == ["ring", "auto"] and cfg["peers"] == ["gloo", "mpi"]
    a = parser().parse_args(["bench"])
    assert config_from_args(a)["collectives"] == list(C.DEFAULT_COLLECTIVES)
    assert config_from_args(a)["imports"] == []
    a = parser().parse_args(["bench", "--import", "my_algos", "--import", "more"])
    assert config_from_args(a)["imports"] == ["my_algos", "more"]
    help_text = parser()._subparsers._group_actions[0].choices["bench"].format_help()
    # Each default is stated once, in the help text itself (argparse's defaults formatter once
    # appended a second copy to every option: "(default 8) (default: 8)").
    flat = " ".join(help_text.split())
    assert "(default 8)" in flat and not re.search(r"\(default[^()]*\)\s*\(default", flat)
    r = parser().parse_args(["report", "a.json", "b.json", "-o", "rep"])
    assert r.files == ["a.json", "b.json"] and r.output == "rep"


def test_mode_out_refuses_a_named_broadcast_and_leaves_it_out_of_all(capsys):
    # commlib's broadcast runs in place only: `commlib bench broadcast --mode out` once timed nothing
    # and wrote an empty report without a word.
    from commlib.bench.launcher import config_from_args
    from commlib.cli import parser
    with pytest.raises(SystemExit, match="--mode out: broadcast runs in place only"):
        config_from_args(parser().parse_args(["bench", "all_reduce", "broadcast", "--mode", "out"]))
    for args in (["all"], []):
        cfg = config_from_args(parser().parse_args(["bench", *args, "--mode", "out"]))
        assert "broadcast" not in cfg["collectives"] and "all_reduce" in cfg["collectives"]
        assert "broadcast left out" in capsys.readouterr().err
    cfg = config_from_args(parser().parse_args(["bench", "broadcast", "--mode", "in"]))
    assert cfg["collectives"] == ["broadcast"] and cfg["modes"] == ["in"]


def test_tuning_from_a_multi_host_run_says_its_hosts(tmp_path):
    # A --hosts 2 run's entry carries its host count and placement, so the cost model (which defers
    # only to rows of the communicator's host count) uses its rows on 2 hosts and not on 1 or 4.
    import commlib._C as _C
    from commlib.sim import topology as sim_topology
    d = synth.data(P=4, sizes=(8, 1 << 20), collectives=("all_reduce",))
    d["config"]["hosts"] = 2
    path = tmp_path / "run.json"
    path.write_text(json.dumps(d))
    from commlib import cli
    out = str(tmp_path / "tuning.json")
    assert cli.main(["tune", str(path), "-o", out]) == 0
    entry = tuning.read(out)["collectives"]["all_reduce"]["4"]
    assert (entry["source"], entry["hosts"], entry["ranks_per_host"]) == ("measured", 2, [2, 2])
    assert "hosts" not in tuning.from_results(d["results"], d["model"])["collectives"]["all_reduce"]["4"]
    model = sim_topology.load("eth-25g").engine_dict(4)
    try:
        tuning.install(tuning.read(out))
        pick = tuning.choose(tuning.read(out), "all_reduce", 8, 4)
        on_two = _C.resolve_algorithm(_C.Collective.all_reduce, "auto", 2, 4, 0, 4, [0, 0, 1, 1], model)
        assert (on_two["source"], on_two["algorithm"]) == ("tuning", pick)
        on_four = _C.resolve_algorithm(_C.Collective.all_reduce, "auto", 2, 4, 0, 4, [0, 1, 2, 3], model)
        assert on_four["source"] == "model"
    finally:
        _C.clear_tuning()
        tuning.load_default()
