"""``commlib bench --compress`` (docs/compression.md): compressed variants beside the uncompressed
calls, checked within the codec's bound, kept out of the peer comparison and reported in their own
section. Timings are never asserted."""
import numpy as np
import pytest

from commlib.bench import arguments, report
from commlib.bench.report_compression import compression_rows
from commlib.bench.references import Reference
from test_bench_run import _bench


def test_compressed_variants_run_and_report(tmp_path):
    data, stdout = _bench(tmp_path, ["all_reduce", "all_gather", "--np", "2", "-b", "4K", "-e", "4K",
                                     "--algorithms", "ring,auto", "--compress", "int8,int4:inter", "-n", "2",
                                     "-w", "1", "--peers", "none", "--passes", "1"])
    recs = data["results"]
    coded = {(r["collective"], r["algorithm"], r["compress"]) for r in recs if r.get("compress")}
    assert coded == {(c, f"{a}+{k}", k) for c in ("all_reduce", "all_gather") for a in ("ring", "auto")
                     for k in ("int8", "int4:inter")}
    assert all(r["wrong"] == 0 for r in recs)
    assert "ring+int8" in stdout
    path = report.generate([data], str(tmp_path / "rep"))
    md = open(path.replace("index.html", "report.md")).read()
    section = md.split("## Compressed collectives (--compress)")[1]
    assert "| all_reduce | 2 | 4 KiB | ring | int8 |" in section
    assert "compress_all_reduce_P2.png" in section
    # the comparison with peers keeps to uncompressed calls
    assert "+int8" not in md.split("## Compressed collectives")[0]


def test_compressed_results_are_checked_within_the_codec_bound():
    """An int4 all_reduce is not exact; the check allows the codec's bound, and no more."""
    ref = Reference("all_reduce", 64, 64, "float32", "sum", 0, 2, 0)
    near = {"recv": (ref.expected + 0.5).astype(np.float32)}
    assert ref.wrong(near) == 64 and ref.wrong(near, "int4") == 0
    far = {"recv": (ref.expected + 100).astype(np.float32)}
    assert ref.wrong(far, "int4") == 64


def test_rows_pair_each_codec_with_the_uncompressed_calls():
    rec = lambda algo, us, codec=None: {  # noqa: E731
        "backend": "commlib", "collective": "all_reduce", "world_size": 4, "bytes": 1 << 20, "mode": "in",
        "algorithm": algo, "time_us": {"median": us}, "compress": codec, "resolved": algo.partition("+")[0]}
    rows = compression_rows([rec("ring", 400.0), rec("tree", 300.0), rec("ring+int8", 100.0, "int8")])
    assert len(rows) == 1
    r = rows[0]
    assert (r["algorithm"], r["codec"], r["plain_us"], r["best_plain_us"]) == ("ring", "int8", 400.0, 300.0)


@pytest.mark.parametrize("flags", [["--compress", "int3"], ["--compress", "int8:intra"],
                                   ["--compress", "int8", "-d", "int32"]])
def test_bad_compress_arguments_are_named(flags):
    import argparse
    p = argparse.ArgumentParser()
    arguments.add_arguments(p)
    with pytest.raises(SystemExit, match="--compress"):
        arguments.config_from_args(p.parse_args(["all_reduce", *flags]))
