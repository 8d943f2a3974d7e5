"""scripts/gpu_check.sh's plan, without a GPU (--dry-run, with stand-ins for nvidia-smi and the MPS
control on PATH): what the bench steps would run on the lent machine. The H100 run's bench_large
failed because the bench asked for an NCCL peer with two ranks on one GPU (bench/RESULTS_gpu.md);
with one GPU the plan must name no NCCL peer, compare both device paths, and under MPS use the
issue's 4 ranks. A dry run writes nothing (no results file, no log folder)."""
import os
import subprocess

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SCRIPT = os.path.join(ROOT, "scripts", "gpu_check.sh")


def _plan(tmp_path, gpus, mps, what="commlib bench"):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    listing = "".join(f"GPU {i}: NVIDIA H100 80GB HBM3 (UUID: GPU-{i})\\n" for i in range(gpus))
    (bin_dir / "nvidia-smi").write_text(f"#!/bin/sh\nprintf '{listing}'\n")
    if mps:
        (bin_dir / "nvidia-cuda-mps-control").write_text("#!/bin/sh\nexit 0\n")
    for f in bin_dir.iterdir():
        f.chmod(0o755)
    env = dict(os.environ, PATH=f"{bin_dir}:{os.environ['PATH']}", TMPDIR=str(tmp_path))
    results = os.path.join(ROOT, "bench", "RESULTS_gpu.md")
    before = os.stat(results).st_mtime_ns if os.path.exists(results) else None
    out = subprocess.run(["bash", SCRIPT, "--dry-run"], env=env, capture_output=True, text=True, timeout=30)
    assert out.returncode == 0, out.stderr
    assert (os.stat(results).st_mtime_ns if os.path.exists(results) else None) == before
    assert not list(tmp_path.glob("gpu_check.*")), "a dry run made a log folder"
    return [ln.strip() for ln in out.stdout.splitlines() if what in ln]


@pytest.mark.parametrize("gpus,mps", [(1, True), (1, False), (2, False)])
def test_the_bench_steps_fit_the_machine(tmp_path, gpus, mps):
    every = _plan(tmp_path, gpus, mps)
    small, large = [c for c in every if "bench all_reduce" in c]
    for cmd in (small, large):
        assert "--device cuda" in cmd and "--paths kernel,copy,auto" in cmd, cmd
        assert ("--peers none" in cmd) == (gpus == 1), cmd  # NCCL refuses ranks sharing a GPU
        assert ("--peers nccl" in cmd) == (gpus > 1), cmd
        assert f"--np {4 if (gpus == 1 and mps) else 2}" in cmd, cmd
        assert "mapped_one_shot,mapped_two_shot,mapped_fused_two_shot" in cmd, cmd  # the one-sided kernels (@kernel)
    assert "-b 8 -e 64K" in small and "-b 64M -e 256M" in large
    # issue #38's reduce_scatter and all_gather targets at 256 MiB, on the kernel path, the fused form among them
    [rs], [ag] = [c for c in every if "bench reduce_scatter" in c], [c for c in every if "bench all_gather" in c]
    assert "mapped_fused" in rs and "--paths kernel" in rs and "-e 256M" in rs, rs
    assert "--algorithms ring,mapped,auto" in ag and "--timeout 60" in ag, ag


@pytest.mark.parametrize("gpus", [1, 2, 4])
def test_the_launch_step_times_one_rank_per_gpu_where_there_are_several(tmp_path, gpus):
    """bench/gpu_launch.py: 4, 2 and 1 ranks on GPU 0 (under MPS) on any machine (4: the issue's
    targets; 1: the launch's fixed cost F, 2: the cross-rank latency), and where there are several
    GPUs also 2 (and 4) ranks one per GPU (docs/gpu.md "The GPU time of one call")."""
    runs = _plan(tmp_path, gpus, True, "bench/gpu_launch.py")
    assert [r.split(" ", 1)[1] for r in runs if "--per-gpu" not in r] == [  # (after the interpreter)
        "bench/gpu_launch.py --np 4 --json bench/results/gpu_launch.json",
        "bench/gpu_launch.py --np 2 --json bench/results/gpu_launch_np2.json",
        "bench/gpu_launch.py --np 1 --json bench/results/gpu_launch_np1.json"], runs
    per_gpu = [r.split("--np ")[1].split()[0] for r in runs if "--per-gpu" in r]
    assert per_gpu == {1: [], 2: ["2"], 4: ["2", "4"]}[gpus], runs


def test_the_trace_step_traces_one_64_MiB_mapped_all_reduce_into_out(tmp_path, monkeypatch):
    """Issue #38 item 6: bench/gpu_trace.py, 4 ranks on GPU 0, its trace under $OUT (what the run
    tool brings back) when that is set; a message plan's (two_shot) beside it."""
    monkeypatch.setenv("OUT", str(tmp_path / "out"))
    runs = _plan(tmp_path, 1, True, "bench/gpu_trace.py")
    assert [r.split(" ", 1)[1] for r in runs] == [
        f"bench/gpu_trace.py --np 4 --size 64M --out {tmp_path / 'out'}/gpu_trace",
        f"bench/gpu_trace.py --np 4 --size 64M --algorithm two_shot --out {tmp_path / 'out'}/gpu_trace/two_shot"], runs


def test_the_auto_route_step_times_auto_beside_every_candidate(tmp_path):
    """The auto_route step (docs/gpu.md "Device auto by the cost model"): device auto's all_reduce
    beside every candidate its cost model ranks (policy/device_auto.h, the same list), on mapped
    buffers and on staged ones through the arena and the slots, at the sizes the prediction covers."""
    from commlib import _C
    runs = [r for r in _plan(tmp_path, 1, True, "bench/gpu_latency.py") if "gpu_auto_" in r]
    assert len(runs) == 2, runs
    candidates = [k["algorithm"] for k in _C.device_auto_candidates(_C.Collective.all_reduce, 4, 1 << 20)]
    for run in runs:
        algos = run.split("--algorithms ")[1].split()[0].split(",")
        assert algos == ["auto"] + candidates, (algos, candidates)
        assert "--paths kernel" in run and "--sizes 256K,1M,4M,64M" in run, run
    mapped, staged = runs
    assert "gpu_auto_mapped" in mapped and "--sweep" not in mapped, mapped
    assert "gpu_auto_staged" in staged and "--sweep COMMLIB_DEVICE_STAGING=pool,slots" in staged, staged
