"""The tuning file's device half from a device bench's records (commlib/bench/device_tuning.py):
"kernel_path" rows selected like the host rows (exact argmins of synthetic times, medians over
runs), "device_path" crossovers from kernel vs copy, device records never in the host rows, and
previous sections carried over where nothing was measured. The end-to-end run on the emulated
device is tests/stream/test_device_path_tuning.py."""
import argparse
import math

import pytest

from commlib.bench import device_tuning, tuning
from commlib.perf import common as C

K, M = 1 << 10, 1 << 20
SIZES = (K, 64 * K, M)


def rec(algo, size, us, P=2, path=None, coll="all_reduce"):
    algbw, busbw = C.bandwidths(coll, size, P, us * 1e-6)
    named = algo.partition("@")[2]
    return {"backend": "commlib", "collective": coll, "algorithm": algo, "mode": "in", "world_size": P,
            "dtype": "float32", "op": "sum", "root": -1, "bytes": size, "count": size // 4,
            "time_us": {"median": us}, "algbw_GBps": algbw, "busbw_GBps": busbw, "wrong": 0,
            **({"path": path or named} if named or path else {})}


def device_records(P=2):
    """direct wins below 1 MiB on the kernel path, ring at 1 MiB; the copy path loses below 1 MiB
    and wins at 1 MiB."""
    times = {"direct@kernel": (5, 20, 900), "ring@kernel": (9, 40, 400),
             "direct@copy": (50, 60, 500), "ring@copy": (60, 80, 300), "auto@kernel": (1, 1, 1)}
    return [rec(a, s, t, P) for a, ts in times.items() for s, t in zip(SIZES, ts)]


def test_kernel_rows_are_the_measured_argmins_and_the_crossover_is_where_copy_wins():
    host = [rec("ring", s, 10.0) for s in SIZES] + [rec("tree", s, 20.0) for s in SIZES]
    table = tuning.from_results(host + device_records())
    cut = int(math.sqrt(64 * K * M))
    assert table["kernel_path"] == {"all_reduce": {"2": {"source": "measured", "dtype": "float32",
                                                         "rows": [[cut, "direct"], [-1, "ring"]]}}}
    assert table["device_path"] == {"2": {"source": "measured", "kernel_max_bytes": cut}}
    # the host rows come from the host records only (no "@path" algorithm, no device time)
    assert table["collectives"]["all_reduce"]["2"]["rows"] == [[-1, "ring"]]


def test_a_record_whose_calls_ran_on_another_path_is_not_counted():
    records = device_records() + [rec("ring@kernel", s, 0.1, path="copy") for s in SIZES]
    assert tuning.from_results(records)["kernel_path"]["all_reduce"]["2"]["rows"][-1] == [-1, "ring"]
    host, device = device_tuning.split(records)
    assert host == [] and {r["algorithm"] for r in device["kernel"]} == {"direct", "ring"}


def test_several_runs_merge_by_median():
    """One run in which ring was fastest at every size does not decide against two that say direct."""
    def run(direct_us):
        recs = [rec("direct@kernel", s, direct_us) for s in SIZES] + [rec("ring@kernel", s, 10.0) for s in SIZES]
        return {"config": {}, "world_size": 2, "results": recs}
    table = tuning.from_runs([run(5.0), run(50.0), run(6.0)])
    assert table["kernel_path"]["all_reduce"]["2"]["rows"] == [[-1, "direct"]]


@pytest.mark.parametrize("kernel, copy, want", [
    ((1, 1, 1), (2, 2, 2), (1 << 63) - 1),              # the kernel never loses: no crossover (the default)
    ((2, 2, 2), (1, 1, 1), K - 1),                      # the copy path always wins: below the smallest size
    ((1, 1, 3), (2, 2, 1), int(math.sqrt(64 * K * M))),  # between the last kernel win and the first copy win
    ((1, 1.04, 1), (2, 1, 2), (1 << 63) - 1),            # one noisy size does not make one (least summed excess)
])
def test_crossover(kernel, copy, want):
    assert device_tuning.crossover(list(SIZES), list(kernel), list(copy)) == want


def test_without_device_records_the_previous_sections_are_kept_and_other_world_sizes_too():
    previous = {"kernel_path": {"all_reduce": {"2": {"rows": [[-1, "two_shot"]]}, "8": {"rows": [[-1, "ring"]]}}},
                "device_path": {"8": {"kernel_max_bytes": 4096}}}
    host = tuning.from_results([rec("ring", s, 10.0) for s in SIZES], previous=previous)
    assert host["kernel_path"] == previous["kernel_path"] and host["device_path"] == previous["device_path"]
    dev = tuning.from_results(device_records(), previous=previous)
    assert dev["kernel_path"]["all_reduce"]["8"] == {"rows": [[-1, "ring"]]}  # not measured here: kept
    assert dev["kernel_path"]["all_reduce"]["2"]["source"] == "measured"       # measured here: replaced
    assert set(dev["device_path"]) == {"2", "8"}


def test_the_crossovers_are_installed_with_the_rows():
    calls = []

    class Recorder:
        def set_tuning(self, coll, rows):
            calls.append((coll, rows))

        def set_device_path_crossovers(self, m):
            calls.append(("device_path", m))

    table = tuning.from_results(device_records(P=4))
    tuning.install(table, Recorder())
    assert ("device_path", {4: table["device_path"]["4"]["kernel_max_bytes"]}) in calls
    assert any(c == "all_reduce" and (4, -1, "ring", 1, True) in rows for c, rows in calls)
    with pytest.raises(ValueError, match="device_path: world size 4: kernel_max_bytes"):
        tuning.install({"device_path": {"4": {"kernel_max_bytes": -3}}}, Recorder())


def test_tune_device_runs_the_bench_on_both_paths(monkeypatch):
    import commlib.bench.launcher as launcher
    from commlib import cli
    seen = []
    monkeypatch.setattr(launcher, "run", lambda a: seen.append(a) or 0)
    assert cli.main(["tune", "--device", "emulated", "-o", "t.json", "--", "all_reduce", "--np", "2"]) == 0
    a = seen[0]
    assert isinstance(a, argparse.Namespace)
    assert (a.device, a.paths, a.peers, a.tune, a.tune_file, a.np_, a.collectives) == (
        "emulated", "kernel,copy", "none", True, "t.json", 2, ["all_reduce"])
