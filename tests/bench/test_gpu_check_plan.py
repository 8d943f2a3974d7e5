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


def _plan(tmp_path, gpus, mps, what="commlib bench", args=(), extra_env=None, rc=0):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    listing = "".join(f"GPU {i}: NVIDIA H100 80GB HBM3 (UUID: GPU-{i})\\n" for i in range(gpus))
    (bin_dir / "nvidia-smi").write_text(f"#!/bin/sh\nprintf '{listing}'\n")
    if mps:
        (bin_dir / "nvidia-cuda-mps-control").write_text("#!/bin/sh\nexit 0\n")
    for f in bin_dir.iterdir():
        f.chmod(0o755)
    env = {k: v for k, v in os.environ.items() if not k.startswith("GPU_CHECK_")}
    env.update(PATH=f"{bin_dir}:{os.environ['PATH']}", TMPDIR=str(tmp_path), **(extra_env or {}))
    results = os.path.join(ROOT, "bench", "RESULTS_gpu.md")
    before = os.stat(results).st_mtime_ns if os.path.exists(results) else None
    out = subprocess.run(["bash", SCRIPT, "--dry-run", *args], env=env, capture_output=True, text=True, timeout=30)
    assert out.returncode == rc, (out.stdout, out.stderr)
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
    assert "-b 16 -e 1M -f 4" in small and "-b 64M -e 256M" in large  # (to 1 MiB: #38's one-shot target)
    # issue #38's reduce_scatter and all_gather targets at 256 MiB, on the kernel path, the fused form among them
    [rs], [ag] = [c for c in every if "bench reduce_scatter" in c], [c for c in every if "bench all_gather" in c]
    assert "mapped_fused" in rs and "--paths kernel" in rs and "-e 256M" in rs, rs
    assert "--algorithms ring,mapped,auto" in ag and "--timeout 60" in ag, ag


@pytest.mark.parametrize("gpus,mps,args", [(1, True, ()), (1, False, ()), (2, False, ()), (1, True, ("--emulated",))])
def test_torchs_symmetric_memory_runs_with_the_bench_steps_ranks_on_one_gpu(tmp_path, gpus, mps, args):
    """Issue #38's peer column (bench_symm: bench/gpu_symm.py, whose default sizes are the bench
    steps', tests/bench/test_gpu_symm.py): the bench's ranks, all on the one GPU; not where each
    rank has a GPU of its own (NCCL is the peer there), not on the emulated device (torch's
    symmetric memory needs CUDA)."""
    bench = [c for c in _plan(tmp_path, gpus, mps, args=args) if "bench all_reduce" in c]
    symm = _plan(tmp_path, gpus, mps, "bench/gpu_symm.py", args=args)
    commands = [c for c in symm if not c.startswith("[")]
    if gpus > 1 or args:
        assert not symm, symm
        return
    np_ = bench[0].split("--np ")[1].split()[0]
    assert [c.split(" ", 1)[1] for c in commands] == [
        f"bench/gpu_symm.py --np {np_} --reps 10 --json bench/results/gpu_bench_symm.json"], symm
    assert np_ == ("4" if mps else "2")


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
    tool brings back) when that is set; a message plan's (two_shot) beside it, each one folder under $OUT
    (the tool brings back files at most two folders down: session 31's two_shot trace, one deeper, was lost)."""
    monkeypatch.setenv("OUT", str(tmp_path / "out"))
    runs = _plan(tmp_path, 1, True, "bench/gpu_trace.py")
    assert [r.split(" ", 1)[1] for r in runs] == [
        f"bench/gpu_trace.py --np 4 --size 64M --out {tmp_path / 'out'}/gpu_trace",
        f"bench/gpu_trace.py --np 4 --size 64M --algorithm two_shot --out {tmp_path / 'out'}/gpu_trace_msg"], runs


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


def _limits(lines):
    return {ln.split("]")[0].lstrip("["): int(ln.split("(at most ")[1].split("s)")[0])
            for ln in lines if ln.startswith("[") and "(at most " in ln}


def test_the_lent_command_fits_the_device_budget_with_a_rerun(tmp_path):
    """--lent: the one command a lent machine runs (15 minutes of device time in all, its start and
    the give-back counted; 10 minutes per command). Its steps' time limits add up to at most its
    budget, and the start, the command, its transfers, an immediate rerun of bench_large and the
    give-back to at most 900 s; and it measures every target of issues #37 and #38 the script has a
    step for: the launch targets at 4 ranks, the staged path, the trace, the kernels' correctness,
    all_reduce to 1 MiB and 64-256 MiB, reduce_scatter and all_gather at 256 MiB."""
    lines = _plan(tmp_path, 1, True, "", args=("--lent",))
    limits = _limits(lines)
    assert list(limits) == ["build", "import", "kernels", "copy", "staged", "launch", "trace", "gpu", "bench_small",
                            "bench_large", "bench_reduce_scatter", "bench_all_gather", "bench_symm"], limits
    summary = [ln for ln in lines if ln.startswith("gpu_check: the steps' time limits add up to")]
    assert summary == [f"gpu_check: the steps' time limits add up to {sum(limits.values())}s, within the 590s "
                       "budget: yes"], summary
    device = [ln for ln in lines if ln.startswith("gpu_check: on the lent machine")][0]
    total = int(device.split(" = ")[1].split("s of")[0])
    assert total == 90 + 590 + 20 + limits["bench_large"] + 20 + 30 and total <= 900, device
    launch = [ln for ln in lines if "bench/gpu_launch.py" in ln and not ln.startswith("[")]
    assert len(launch) == 1 and "--np 4 " in launch[0], launch  # the 4 ranks only
    # the large all_reduce on the kernel path alone (the copy path's 90-320 ms calls cut session 14's),
    # the copy path timed by the copy step's short form instead
    large = [ln for ln in lines if "bench all_reduce" in ln and "-b 64M" in ln and not ln.startswith("[")]
    assert len(large) == 1 and "--paths kernel " in large[0], large
    copy = [ln for ln in lines if "--paths copy" in ln and not ln.startswith("[")]
    assert len(copy) == 1 and "COMMLIB_DEVICE_COPY_RECV=gated,mirror,ungated,driver" in copy[0], copy


@pytest.mark.parametrize("budget,why", [("400", "limits over the budget"), ("600", "over one command")])
def test_a_lent_plan_that_does_not_fit_fails_the_dry_run(tmp_path, budget, why):
    """A budget below the steps' limits, or beyond what one command may run, fails the dry run (so
    raising a step's limit past the budget fails here, before a machine is asked for)."""
    _plan(tmp_path, 1, True, "", args=("--lent",), extra_env={"GPU_CHECK_BUDGET_S": budget}, rc=1)


def test_the_full_plan_says_what_its_limits_add_up_to(tmp_path):
    lines = _plan(tmp_path, 1, True, "")
    limits = _limits(lines)
    assert "torch" in limits and "trace_msg" in limits and "launch_np1" in limits, limits
    assert f"gpu_check: the steps' time limits add up to {sum(limits.values())}s, within the 470s budget: NO" in lines


def test_every_lent_step_has_a_prediction_that_the_report_carries(tmp_path):
    """The rule: the model's prediction is in docs/gpu.md before the run. Every step of --lent has a
    row in docs/gpu.md's table of predictions (its first column names it), and the report
    (scripts/gpu_check_lib.sh's write_report) prints that table beside the measurements."""
    steps = _limits(_plan(tmp_path, 1, True, "", args=("--lent",)))
    table = subprocess.run(["bash", "-c", f'ROOT={ROOT}; . "$ROOT/scripts/gpu_check_lib.sh"; predictions_table'],
                           capture_output=True, text=True, timeout=30, check=True).stdout.splitlines()
    named = " ".join(row.split("|")[1] for row in table[2:])
    assert all(s in named for s in steps), (steps, table)
    assert all(row.count("|") == 4 and row.split("|")[3].strip() for row in table[2:]), table  # a prediction each
    text = open(os.path.join(ROOT, "scripts", "gpu_check_lib.sh")).read()
    assert text.index("predictions_table\n") > text.index('printf \'%s\\n\' "${rows[@]}"'), "not in the report"
