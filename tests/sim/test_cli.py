"""``commlib sim`` and ``commlib tune --sim`` end to end (in process)."""
import json

import commlib
import commlib._C as _C
from commlib.bench import tuning
from commlib.cli import main


def test_sim_table_and_json(tmp_path, capsys):
    out = tmp_path / "sim.json"
    assert main(["sim", "all_reduce", "--algorithm", "ring,rabenseifner,auto", "--topology", "dgx-h100",
                 "--nodes", "1,2", "-b", "1K", "-e", "1M", "-f", "32", "--json", str(out)]) == 0
    text = capsys.readouterr().out
    assert "all_reduce (predicted), 8 ranks = 1 host(s) of dgx-h100" in text
    assert "16 ranks = 2 host(s)" in text
    data = json.loads(out.read_text())
    recs = data["results"]
    assert data["topology"]["name"] == "dgx-h100"
    assert {(r["world_size"], r["bytes"]) for r in recs} == {(P, b) for P in (8, 16) for b in (1024, 32768, 1 << 20)}
    assert {r["algorithm"] for r in recs} == {"ring", "rabenseifner", "auto"}
    for r in recs:
        assert r["backend"] == "sim" and r["resolved"] in _C.algorithms(_C.Collective.all_reduce)
        assert r["busbw_GBps"] == r["algbw_GBps"] * 2 * (r["world_size"] - 1) / r["world_size"]


def test_sim_np_and_errors(tmp_path, capsys):
    assert main(["sim", "all_to_all", "--topology", "eth-25g", "--np", "3", "-b", "64", "-e", "64"]) == 0
    assert "3 ranks = 3 host(s) of eth-25g" in capsys.readouterr().out
    assert main(["sim", "all_reduce", "--topology", "nope"]) == 2
    assert "neither a preset" in capsys.readouterr().err
    assert main(["sim", "all_reduce", "--topology", "dgx-h100", "--algorithm", "bogus", "-e", "8"]) == 2
    assert "algorithm: unknown all_reduce algorithm 'bogus'" in capsys.readouterr().err


def test_tune_sim_writes_a_loadable_table(tmp_path, capsys):
    out = tmp_path / "tuning.json"
    assert main(["tune", "--sim", "eth-100g", "--np", "4,16", "--collectives", "all_reduce",
                 "-b", "8", "-e", "16M", "-o", str(out)]) == 0
    table = tuning.read(str(out))
    entry = table["collectives"]["all_reduce"]["16"]
    assert entry["source"] == "sim:eth-100g"
    # The largest size's pick is within 10% of the best prediction there.
    from commlib import sim
    preds = {a: sim.predict("all_reduce", a, 16 << 20, 16, "eth-100g")["time_us"]["median"]
             for a in commlib.algorithms("all_reduce")}  # what tune chooses from: no one-sided ones
    assert preds[entry["rows"][-1][1]] <= 1.1 * min(preds.values())
    assert tuning.rows_for(table, "all_reduce")[0][0] == 4
    assert main(["tune", "--sim", "eth-100g"]) == 2  # no -o: refuses to overwrite this machine's file
    assert "-o FILE is required" in capsys.readouterr().err


def test_report_at_scale_section(tmp_path):
    sim_json, out = tmp_path / "sim.json", tmp_path / "report"
    assert main(["sim", "all_reduce", "--algorithm", "recursive_doubling,rabenseifner", "--topology", "dgx-h100",
                 "--nodes", "1,4", "-b", "1K", "-e", "1G", "-f", "1024", "--json", str(sim_json)]) == 0
    assert main(["report", str(sim_json), "-o", str(out)]) == 0
    md = (out / "report.md").read_text()
    assert "## At scale (simulated)" in md and "### all_reduce on dgx-h100" in md
    # small messages: fewer steps win; from 1 MiB (sub-us NVLink steps, NCCL's LL figures in the
    # preset) Rabenseifner's 2(P-1)/P n bytes win
    assert "| 8 | recursive_doubling | rabenseifner | rabenseifner |" in md
    assert "1 MiB: recursive_doubling -> rabenseifner" in md
    assert (out / "sim_dgx-h100_all_reduce_winners.png").stat().st_size > 1000


def test_sim_names_hierarchical_phases(tmp_path, capsys):
    """--algorithm hierarchical/<inter>/<intra>: the record carries both phases' algorithms and its
    prediction is the simulator's for them; a malformed name is refused naming the argument."""
    out = tmp_path / "sim.json"
    assert main(["sim", "all_gather", "--algorithm", "hierarchical/bruck,hierarchical/bruck/ring", "--topology",
                 "dgx-h100", "--nodes", "4", "-b", "1M", "-e", "1M", "--json", str(out)]) == 0
    recs = {r["algorithm"]: r for r in json.loads(out.read_text())["results"]}
    assert (recs["hierarchical/bruck"]["inter_algorithm"], recs["hierarchical/bruck"]["intra_algorithm"]) == ("bruck", "")
    both = recs["hierarchical/bruck/ring"]
    assert (both["resolved"], both["inter_algorithm"], both["intra_algorithm"]) == ("hierarchical", "bruck", "ring")
    assert both["time_us"]["median"] != recs["hierarchical/bruck"]["time_us"]["median"]
    capsys.readouterr()
    assert main(["sim", "all_gather", "--algorithm", "ring/bruck", "--topology", "dgx-h100", "-e", "8"]) == 2
    assert "algorithm: 'ring/bruck'" in capsys.readouterr().err
