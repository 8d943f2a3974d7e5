"""bench/gpu_symm.py (scripts/gpu_check.sh's bench_symm step: torch's symmetric-memory all_reduce as
issue #38's peer column). Here, with a CPU build of torch: its arguments, that it uses the bench
step's sizes, that a torch that cannot run it is recorded as ``refused: <reason>`` without starting
ranks, and its report's refusal lines. On a GPU (``@gpu``): torch's rows and commlib's in one job."""
import json
import os
import sys
import types

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "bench"))
import gpu_symm  # noqa: E402
from commlib.perf.common import size_list  # noqa: E402


def test_the_default_sizes_are_the_bench_steps():
    """gpu_check.sh's bench_small (-b 16 -e 1M -f 4) and bench_large (-b 64M -e 256M -f 4)."""
    args = gpu_symm.parse_args([])
    assert args.sizes == size_list(16, 1 << 20, 4) + size_list(64 << 20, 256 << 20, 4)
    assert args.algorithms == ["one_shot", "two_shot"] and args.np == 4 and args.allow_overlap == "1"
    assert args.ours == ["mapped_one_shot", "mapped_fused_two_shot"]
    assert gpu_symm.parse_args(["--sizes", "64K,1M", "--ours", ""]).sizes == [65536, 1 << 20]
    assert gpu_symm.parse_args(["--ours", ""]).ours == []


@pytest.mark.parametrize("argv", [["--algorithms", "three_shot"], ["--algorithms", ""], ["--np", "1"],
                                  ["--sizes", "2"], ["--allow-overlap", "yes"]])
def test_bad_arguments_are_refused_by_name(argv, capsys):
    with pytest.raises(SystemExit) as e:
        gpu_symm.parse_args(argv)
    assert e.value.code == 2
    assert argv[0] in capsys.readouterr().err


def test_a_torch_without_cuda_is_recorded_as_refused_without_starting_ranks(tmp_path, monkeypatch, capsys):
    """This machine's torch is a CPU build: every row says why, no rank starts, the step passes."""
    import torch
    if torch.cuda.is_available():
        pytest.skip("torch sees a CUDA device here: the @gpu test below runs instead")
    import commlib.testing.ranks as ranks

    def no_pool(*a, **k):
        raise AssertionError("a rank pool started although torch cannot run the step")
    monkeypatch.setattr(ranks, "RankPool", no_pool)
    out = tmp_path / "symm.json"
    assert gpu_symm.main(["--np", "4", "--json", str(out)]) == 0
    data = json.loads(out.read_text())
    assert data["TORCH_SYMM_MEM_ALLOW_OVERLAPPING_DEVICES"] == "1" and data["np"] == 4
    assert len(data["rows"]) == 2 * len(gpu_symm.SIZES)
    assert all(r["path"] == "torch symm" and "sees no CUDA device" in r["refused"] for r in data["rows"]), data
    text = capsys.readouterr().out
    assert "- torch symm one_shot at every size (16 B .. 256 MiB): refused: torch " in text, text
    assert "- torch symm two_shot at every size (16 B .. 256 MiB): refused: torch " in text, text
    assert "| path |" not in text  # nothing measured: no empty table


def test_a_torch_without_the_ops_is_named():
    fake = types.SimpleNamespace(__version__="9.9", ops=types.SimpleNamespace(symm_mem=types.SimpleNamespace()),
                                 cuda=types.SimpleNamespace(is_available=lambda: True), version=None)
    assert gpu_symm.unavailable(fake) == "torch 9.9 has no torch.ops.symm_mem.one_shot_all_reduce_out"


def test_torchs_reason_is_its_first_line():
    err = RuntimeError("CUDASymmetricMemoryAllocator::rendezvous: detected allocations from overlapping devices "
                       "from different ranks.\nException raised from rendezvous at CUDASymmetricMemory.cu:1\n"
                       "frame #0: c10::Error::Error")
    assert gpu_symm.refusal(err) == ("CUDASymmetricMemoryAllocator::rendezvous: detected allocations from "
                                     "overlapping devices from different ranks.")


def test_the_report_puts_measured_rows_in_gpu_latencys_table_and_groups_refusals():
    clocks = dict(sync=30.0, loop=20.0, gpu=25.0, enqueue=8.0)
    rows = [dict(path="torch symm", algorithm="one_shot", bytes=65536, ran="torch", **clocks),
            dict(path="torch symm", algorithm="two_shot", bytes=65536, refused="input must be 16-byte aligned"),
            dict(path="torch symm", algorithm="two_shot", bytes=16, refused="input must be 16-byte aligned"),
            dict(path="kernel", algorithm="mapped_one_shot", bytes=65536, ran="kernel", **clocks)]
    text = gpu_symm.markdown(rows, 4, True, "1")
    table = [ln for ln in text.splitlines() if ln.startswith("| ")]
    assert table[0].startswith("| path | algorithm | size | sync µs")
    assert "| torch symm | one_shot | 64 KiB | 30.0 | 20.0 | 25.0 | 8.0 |" in text, text
    assert "| kernel | mapped_one_shot | 64 KiB | 30.0 |" in text, text
    assert "- torch symm two_shot at 64 KiB, 16 B: refused: input must be 16-byte aligned" in text, text
    assert "4 ranks on GPU 0 under MPS" in text and "TORCH_SYMM_MEM_ALLOW_OVERLAPPING_DEVICES=1" in text


def _group_sums(comm):
    """A rank's side: gpu_symm's gloo group (its store's port from rank 0 through commlib), then a
    sum over it; the group goes away after (the pool's ranks are shared)."""
    import torch
    import torch.distributed as dist
    name = gpu_symm._torch_group(comm, torch)
    try:
        t = torch.full((3,), float(comm.rank + 1))
        dist.all_reduce(t)
        return name, t.tolist(), dist.get_world_size()
    finally:
        dist.destroy_process_group()


@pytest.mark.timeout(120)
def test_the_ranks_torch_group_spans_the_pool():
    """The part of a rank's side that runs without CUDA: torch's group over the pool's ranks, through
    which torch's symmetric memory exchanges its handles. A pool of its own: a cached pool's ranks
    may hold a default process group another module's test made (CI saw "trying to initialize the
    default process group twice")."""
    from commlib.testing.ranks import RankPool
    ranks = RankPool(3, timeout=60)
    try:
        out = ranks.run(_group_sums, timeout=90)
    finally:
        ranks.close()
    assert [o[1:] for o in out] == [([6.0] * 3, 3)] * 3, out
    assert len({o[0] for o in out}) == 1, out


@pytest.mark.gpu
@pytest.mark.timeout(300)
def test_torchs_symmetric_memory_all_reduce_beside_ours_on_one_gpu(tmp_path):
    """Two ranks on GPU 0: torch's one_shot and two_shot are measured with correct sums, or refused
    with torch's reason; never a wrong result; commlib's mapped_one_shot is measured in the same job."""
    out = tmp_path / "symm.json"
    assert gpu_symm.main(["--np", "2", "--sizes", "64K,1M", "--reps", "3", "--ours", "mapped_one_shot",
                          "--json", str(out), "--timeout", "240"]) == 0
    rows = json.loads(out.read_text())["rows"]
    assert not [r for r in rows if "error" in r], rows
    torch_rows = [r for r in rows if r["path"] == "torch symm"]
    assert len(torch_rows) == 4 and all(r.get("ran") == "torch" or r.get("refused") for r in torch_rows), rows
    assert [r for r in rows if r["path"] == "kernel" and r["algorithm"] == "mapped_one_shot" and r.get("ran")], rows


def test_a_row_refused_on_one_rank_is_refused_in_the_merge():
    clocks = dict(sync=30.0, loop=20.0, gpu=25.0, enqueue=8.0)
    slow = dict(clocks, sync=40.0)
    ok = dict(path="torch symm", algorithm="one_shot", bytes=16, ran="torch")
    no = dict(path="torch symm", algorithm="two_shot", bytes=16)
    merged = gpu_symm.merge([[dict(ok, **clocks), dict(no, **clocks)],
                             [dict(ok, **slow), dict(no, refused="rank 1's reason")]])
    assert merged[0]["sync"] == 40.0 and merged[0]["loop"] == 20.0
    assert merged[1]["refused"] == "rank 1's reason"
