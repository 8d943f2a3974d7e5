"""`commlib bench --device emulated --paths kernel,copy,auto`: each path on its own sub-communicator
(algorithms named `<algorithm>@<path>`), every record names the path its calls ran on (auto: the
kernel at every size unless a tuning file's crossover says copy), the results are checked (-c 1), the device copy bandwidth
is measured, and the report puts the paths side by side, saying the emulated numbers say nothing
about a GPU."""
import os
import sys

import pytest

from commlib.bench import device_paths

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from kernel_path_cases import sweep_paths  # noqa: E402

from emulated_pools import DELAY_ENV  # noqa: E402  (the device matrix's pools)
CFG = {"collectives": ["all_reduce"], "sizes": [64, 2 << 20], "dtype": "float32", "op": "sum", "root": 0,
       "iters": 2, "min_time": 0, "max_iters": 2, "warmup": 1, "check": True, "rounds": 1, "modes": ["in"],
       "algorithms": ["ring"], "peers": [], "device": "emulated", "paths": ["kernel", "copy", "auto"]}


@pytest.mark.timeout(120)
def test_the_bench_compares_the_paths(pool):
    records, info, transport, wrong = pool(2, env=DELAY_ENV).run(sweep_paths, CFG, timeout=100)[0]
    ran = {(r["algorithm"], r["bytes"]): r["path"] for r in records}
    assert ran == {("ring@kernel", 64): "kernel", ("ring@kernel", 2 << 20): "kernel",
                   ("ring@copy", 64): "copy", ("ring@copy", 2 << 20): "copy",
                   ("ring@auto", 64): "kernel", ("ring@auto", 2 << 20): "kernel"}, ran
    assert wrong == 0 and all(r["wrong"] == 0 for r in records)
    assert info["device_copy_GBps"] > 0 and "paths kernel, copy, auto" in transport
    report = device_paths.markdown({"results": records, "world_size": 2, "backends": {"commlib": info}})
    assert "kernel µs" in report and "copy µs" in report and "auto ran" in report, report
    assert "say nothing about a GPU" in report, report
    # `commlib tune` on these records: the kernel path's records make the "kernel_path" rows, no
    # host row comes from a device path's records.
    from commlib.bench import tuning
    table = tuning.from_results(records)
    assert table["kernel_path"] == {"all_reduce": {"2": {"source": "measured", "dtype": "float32",
                                                         "rows": [[-1, "ring"]]}}}, table
    assert table["collectives"] == {}, table


@pytest.mark.timeout(120)
def test_the_bench_runs_the_one_sided_algorithms_on_the_kernel_path(pool):
    """`--algorithms mapped_two_shot,two_shot --paths kernel,copy`: the one-sided algorithm only as
    `@kernel` (the copy path refuses it), checked; the bench's buffers are mapped, so a size whose
    staged buffers would not fit the slots (4 x 64 KiB per peer, 2 ranks: 512 KiB) runs too."""
    cfg = dict(CFG, sizes=[4096, 1 << 20], algorithms=["mapped_two_shot", "two_shot"], paths=["kernel", "copy"])
    slots = {"COMMLIB_DEVICE_SLOT_BYTES": "65536", "COMMLIB_DEVICE_SLOTS": "4"}
    records, _, _, wrong, text = pool(2, env=DELAY_ENV).run(sweep_paths, cfg, slots, True, timeout=100)[0]
    ran = {(r["algorithm"], r["bytes"]): r["path"] for r in records}
    assert ran == {("mapped_two_shot@kernel", 4096): "kernel", ("two_shot@kernel", 4096): "kernel",
                   ("two_shot@copy", 4096): "copy", ("two_shot@kernel", 1 << 20): "kernel",
                   ("two_shot@copy", 1 << 20): "copy", ("mapped_two_shot@kernel", 1 << 20): "kernel"}, ran
    assert wrong == 0 and all(r["wrong"] == 0 for r in records)
    assert "refused" not in text, text


class _RefusingBackend:
    """One rank; algorithm "b" is refused with a ValueError at sizes above 64 bytes, as the kernel
    path refuses a staged one-sided call whose buffers do not fit its slots."""
    name, transport, rank, size = "commlib", "stub", 0, 1

    def algorithms(self, collective):
        return ["a", "b"]

    def supports(self, collective, mode, op, dtype):
        return True

    def refusable(self, collective, algorithm):
        return algorithm == "b"

    def make(self, collective, algorithm, mode, bufs, op, root):
        n = bufs["send"].nbytes

        def call():
            if algorithm == "b" and n > 64:
                raise ValueError(f"algorithm: b needs {n}")
        return call

    def barrier(self):
        pass

    def gather_stats(self, vec):
        return vec[None, :]

    def resolve(self, collective, algorithm, size, dtype):
        return algorithm


def test_the_sweep_leaves_out_a_call_refused_at_a_size():
    """A refusable algorithm refused at one size: that size's row for it is empty and the sweep
    says why, the other algorithm and the other size are measured; a refusal of an algorithm the
    backend does not call refusable still ends the sweep."""
    import io
    from commlib.bench.sweep import Sweep
    cfg = dict(CFG, sizes=[64, 4096], algorithms=["all"], check=False, device="host", paths=None)
    out = io.StringIO()
    records = Sweep(_RefusingBackend(), cfg, out=out).run()
    assert {(r["algorithm"], r["bytes"]) for r in records} == {("a", 64), ("a", 4096), ("b", 64)}
    assert "all_reduce b (in) at 4096 B refused: algorithm: b needs 4096" in out.getvalue(), out.getvalue()
    backend = _RefusingBackend()
    backend.refusable = lambda collective, algorithm: False
    with pytest.raises(ValueError, match="b needs 4096"):
        Sweep(backend, cfg, out=io.StringIO()).run()


def test_path_rows_pair_the_paths_of_a_size():
    def rec(algo, path, us):
        return {"backend": "commlib", "collective": "all_reduce", "bytes": 8, "mode": "in", "algorithm": algo,
                "time_us": {"median": us}, "busbw_GBps": 0.5, "path": path}
    rows = device_paths.path_rows([rec("ring@kernel", "kernel", 10.0), rec("ring@copy", "copy", 30.0),
                                   rec("ring@auto", "kernel", 11.0), rec("ring", "kernel", 1.0)])
    assert len(rows) == 1 and rows[0]["algorithm"] == "ring"
    assert rows[0]["copy_over_kernel"] == pytest.approx(3.0) and rows[0]["auto"]["ran"] == "kernel"


def test_unknown_paths_are_refused():
    with pytest.raises(SystemExit, match="--paths"):
        device_paths.parse_paths("kernel,fast")


def test_tune_writes_the_kernel_paths_rows_from_its_records():
    """Exact selection: per size the fastest algorithm of the kernel path's records (the host
    rows' rule, choose_path), copy and auto records ignored, plain names still the host rows, and
    a previous file's kernel-path entries of other world sizes kept."""
    from commlib.bench import tuning

    def rec(algo, nbytes, us, P=4):
        return {"backend": "commlib", "collective": "all_reduce", "bytes": nbytes, "mode": "in", "algorithm": algo,
                "time_us": {"median": us}, "dtype": "float32", "world_size": P}
    records = [rec("direct@kernel", 8, 5.0), rec("ring@kernel", 8, 20.0),
               rec("direct@kernel", 4 << 20, 900.0), rec("ring@kernel", 4 << 20, 300.0),
               rec("ring@copy", 8, 1.0), rec("direct@auto", 4 << 20, 1.0),  # never rows
               rec("tree", 8, 3.0), rec("ring", 8, 9.0)]
    previous = {"kernel_path": {"all_reduce": {"8": {"rows": [[-1, "two_shot"]]}, "4": {"rows": [[-1, "tree"]]}}}}
    table = tuning.from_results(records, previous=previous)
    assert table["kernel_path"]["all_reduce"]["4"]["rows"] == [[int((8 * (4 << 20)) ** 0.5), "direct"], [-1, "ring"]]
    assert table["kernel_path"]["all_reduce"]["8"] == {"rows": [[-1, "two_shot"]]}
    assert table["collectives"]["all_reduce"]["4"]["rows"] == [[-1, "tree"]]
