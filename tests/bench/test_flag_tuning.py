"""commlib.bench.flag_tuning: the tuning file's "flags" section (up to which size auto takes the
shared-memory flags rather than the table's algorithm, csrc/policy/flag_cutoff.h), from bench
records, and how `commlib tune` uses it for the rows and the machine section."""
import math

import pytest

from commlib.bench import flag_tuning, tuning
from commlib.perf.common import core_bytes

pytestmark = pytest.mark.timeout(60)

SIZES = (8, 32, 128, 512, 2048, 8192, 32768)


def record(algorithm, nbytes, us, resolved=None, collective="all_reduce"):
    r = {"backend": "commlib", "collective": collective, "world_size": 4, "bytes": nbytes, "dtype": "float32",
         "algorithm": algorithm, "time_us": {"median": us}}
    if resolved:
        r["resolved"] = resolved
    return r


def runs(flag_us, flags_up_to=8192):
    """ring and recursive_doubling at every size (recursive_doubling 10 us ahead up to 8 KiB, ring ahead
    above), and auto: the flags up to ``flags_up_to`` bytes at flag_us(size) us, ring above."""
    recs = []
    for b in SIZES:
        rd, ring = (20.0, 30.0) if b <= 8192 else (60.0, 50.0)
        recs += [record("recursive_doubling", b, rd), record("ring", b, ring),
                 record("auto", b, flag_us(b), "flags") if b <= flags_up_to else record("auto", b, ring, "ring")]
    return recs


def test_the_first_size_where_a_named_algorithm_beats_the_flags_ends_them():
    recs = runs(lambda b: 10.0 if b < 8192 else 22.0)  # the flags 10% behind recursive_doubling at 8 KiB
    section = flag_tuning.cutoffs(recs)
    assert section == {"all_reduce": {"4": {"max_bytes": int(math.sqrt(2048 * 8192)), "lost_at": 8192}}}
    # the rows: 8 KiB joins the sizes the table decides (recursive_doubling there, ring above)
    table = tuning.from_results(recs)
    assert table["flags"] == section
    rows = table["collectives"]["all_reduce"]["4"]["rows"]
    assert tuning.choose(table, "all_reduce", 8192, 4) == "recursive_doubling", rows
    assert tuning.choose(table, "all_reduce", 32768, 4) == "ring", rows


def test_within_the_margin_the_flags_stay():
    # 2% behind the best: within FLAG_MARGIN (3%), no entry; the slot decides as before
    recs = runs(lambda b: 10.0 if b < 8192 else 20.0 * 1.02)
    assert flag_tuning.cutoffs(recs) == {}
    assert "flags" not in tuning.from_results(recs)


def test_flags_beaten_at_the_smallest_size_are_never_taken():
    recs = runs(lambda b: 25.0)
    assert flag_tuning.cutoffs(recs) == {"all_reduce": {"4": {"max_bytes": -1, "lost_at": 8}}}


def test_an_entry_is_kept_where_the_runs_show_no_loss():
    # runs made with a cutoff in force time the flags only below it: they cannot move it up
    previous = {"all_reduce": {"4": {"max_bytes": 4096, "lost_at": 8192}}}
    recs = runs(lambda b: 10.0, flags_up_to=2048)
    assert flag_tuning.cutoffs(recs, previous) == previous
    assert tuning.from_results(recs, previous={"flags": previous})["flags"] == previous
    # and a loss seen in these runs replaces it
    assert flag_tuning.cutoffs(runs(lambda b: 10.0 if b < 2048 else 40.0), previous)["all_reduce"]["4"][
        "max_bytes"] == int(math.sqrt(512 * 2048))


def test_still_flagged_follows_the_cutoff():
    flagged = {8, 32, 2048, 8192}
    series = [(b, core_bytes("all_reduce", b, "float32", 4), {}) for b in SIZES]
    assert flag_tuning.still_flagged(flagged, series, None) == flagged
    assert flag_tuning.still_flagged(flagged, series, {"max_bytes": 4096}) == {8, 32, 2048}
    assert flag_tuning.still_flagged(flagged, series, {"max_bytes": -1}) == set()


def test_the_machine_section_carries_the_cutoffs_and_keeps_the_replaced_ones():
    machine = {"cpu": "Test CPU", "cores": 2}
    data = {"machine": machine, "config": {}, "results": runs(lambda b: 10.0 if b < 8192 else 22.0)}
    section = tuning.machine_section([data])
    assert section["flags"]["all_reduce"]["4"]["max_bytes"] == 4096
    kept = {"all_gather": {"4": {"max_bytes": 100, "lost_at": 128}}}
    quiet = {"machine": machine, "config": {}, "results": runs(lambda b: 10.0)}
    assert tuning.machine_section([quiet], replaced={"machine": machine, "flags": kept})["flags"] == kept
