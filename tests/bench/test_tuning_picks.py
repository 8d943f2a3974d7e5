"""commlib.bench.tuning_picks: the sizes a tuning table's rows decide. Where every auto record ran
the flags (host/lowering.cc flag_route, ahead of the table), the rows are never read, so the named
algorithms' times there must not steer the path (choose_path's switch cost)."""
import pytest

from commlib.bench import tuning_picks
from commlib.perf.common import core_bytes

pytestmark = pytest.mark.timeout(60)

SIZES = (16, 128, 2048, 8192, 32768, 131072, 524288)


def record(algorithm, nbytes, us, resolved=None):
    r = {"backend": "commlib", "collective": "all_to_all", "world_size": 4, "bytes": nbytes, "dtype": "float32",
         "algorithm": algorithm, "time_us": {"median": us}}
    if resolved:
        r["resolved"] = resolved
    return r


def runs(flags_up_to):
    """direct 5% ahead of pairwise up to 8 KiB, pairwise 8% ahead at 32 KiB, direct ahead above;
    auto ran the flags up to ``flags_up_to`` bytes (and the table's pick above)."""
    recs = []
    for b in SIZES:
        d, p = (100.0, 105.0) if b <= 8192 else (108.0, 100.0) if b == 32768 else (100.0, 120.0)
        recs += [record("direct", b, d), record("pairwise", b, p),
                 record("auto", b, 50.0, "flags" if b <= flags_up_to else "direct")]
    return recs


def test_sizes_the_flags_take_do_not_steer_the_rows():
    assert tuning_picks.flag_sizes(runs(8192)) == {("all_to_all", 4, b) for b in SIZES if b <= 8192}
    rows = tuning_picks.measured_entries(runs(8192), None)["all_to_all"]["4"]["rows"]
    # the flags' sizes their own path (read only where the flags cannot run), then pairwise at the
    # first size the table decides, then direct
    cut = core_bytes("all_to_all", 8192, "float32", 4)
    assert [a for _, a in rows] == ["direct", "pairwise", "direct"] and cut <= rows[0][0] < core_bytes(
        "all_to_all", 32768, "float32", 4)
    # Without flag calls, the small sizes count: one row (direct) is cheaper than two switches.
    assert tuning_picks.measured_entries(runs(0), None)["all_to_all"]["4"]["rows"] == [[-1, "direct"]]
    # bench.tuning.from_results (commlib tune) picks alike
    from commlib.bench import tuning
    assert tuning.from_results(runs(8192))["collectives"]["all_to_all"]["4"]["rows"] == rows


def test_a_size_counts_when_any_auto_record_there_ran_a_schedule():
    recs = runs(8192) + [record("auto", 8192, 60.0, "direct")]  # another run's auto, past the flags
    assert ("all_to_all", 4, 8192) not in tuning_picks.flag_sizes(recs)
    (series,) = tuning_picks.measured_picks(recs).values()
    flagged = {b for _, _, b in tuning_picks.flag_sizes(recs)}
    assert tuning_picks.choose_picks(series, flagged)[:4] == ["direct"] * 4
    assert tuning_picks.choose_picks(series, set()) == tuning_picks.choose_path([t for _, _, t in series])


def test_rows_follow_the_mode_of_the_usual_call():
    # ring is first in place and 20% behind out of place, direct the other way round: all_reduce's
    # usual call is in place (torch's), all_gather's out of place; a size measured in one mode only
    # is tuned from it.
    from commlib.bench import tuning

    def rec(coll, alg, mode, us, nbytes=1 << 20):
        return {"backend": "commlib", "collective": coll, "world_size": 4, "bytes": nbytes, "dtype": "float32",
                "algorithm": alg, "mode": mode, "time_us": {"median": us}}

    recs = []
    for coll in ("all_reduce", "all_gather"):
        recs += [rec(coll, "ring", "in", 100.0), rec(coll, "direct", "in", 120.0),
                 rec(coll, "ring", "out", 120.0), rec(coll, "direct", "out", 100.0)]
    assert {(r["collective"], r["mode"]) for r in tuning_picks.usual_mode(recs)} == {
        ("all_reduce", "in"), ("all_gather", "out")}
    table = tuning.from_results(recs)
    assert tuning.choose(table, "all_reduce", 1 << 20, 4) == "ring"
    assert tuning.choose(table, "all_gather", core_bytes("all_gather", 1 << 20, "float32", 4), 4) == "direct"
    only_in = [r for r in recs if r["mode"] == "in"]
    assert tuning_picks.usual_mode(only_in) == only_in
