"""bench/gpu_latency.py on the emulated device (2 ranks): a (path, algorithm, size) the library
refuses (a ValueError before anything is sent, alike on every rank) is left out of the table with a
line saying why, and the rest of the table still prints."""
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "bench"))
import gpu_latency  # noqa: E402


def test_a_refused_staged_call_is_left_out_and_the_rest_of_the_table_prints(capsys):
    """--staged (buffers no peer maps) through the slots (COMMLIB_DEVICE_STAGING=slots; the default
    staging arena grows to fit) with 64 KiB slots: a 1 MiB mapped_one_shot needs 1 MiB of staging
    where 2 ranks x 4 slots x 64 KiB hold 512 KiB, so it is refused; ring runs after it on the same
    communicators, and the correctness check after the size still passes."""
    rc = gpu_latency.main(["--device", "emulated", "--np", "2", "--sizes", "1M", "--reps", "2", "--paths", "kernel",
                           "--algorithms", "mapped_one_shot,ring", "--staged",
                           "--sweep", "COMMLIB_DEVICE_SLOT_BYTES=65536", "--sweep", "COMMLIB_DEVICE_STAGING=slots",
                           "--timeout", "60"])
    out = capsys.readouterr().out
    assert rc == 0
    table = [line for line in out.splitlines() if line.startswith("|")]
    assert any("| kernel | ring | 1 MiB |" in line for line in table), out
    assert not any("mapped_one_shot" in line or "check" in line for line in table), out
    left_out = [line for line in out.splitlines() if "left out" in line]
    assert len(left_out) == 1, out
    assert "kernel mapped_one_shot at 1 MiB left out, refused: count: 262144 elements" in left_out[0], left_out
    assert "needs 1048576 bytes of staging, the slots area holds 524288" in left_out[0], left_out
