"""Whether the @pytest.mark.gpu tests run, skip, or fail (issue #23, item 4).

No GPU listed by nvidia-smi and no CUDA module: skip ("no CUDA device"). A GPU listed but
``commlib._C_cuda`` not importing (a driver older than the CUDA runtime it links statically, a
build without nvcc): every GPU test fails with the import error, never a silent skip.
"""
from __future__ import annotations

import shutil
import subprocess
from typing import Optional, Tuple


def listed_gpus(run=subprocess.run, which=shutil.which) -> int:
    """How many GPUs ``nvidia-smi -L`` lists (0 without nvidia-smi or when it fails)."""
    if which("nvidia-smi") is None:
        return 0
    try:
        out = run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.SubprocessError):
        return 0
    return sum(1 for line in out.splitlines() if line.startswith("GPU "))


def cuda_import_error() -> Optional[str]:
    """None if ``commlib._C_cuda`` imports and sees a device, else why not."""
    try:
        import commlib._C_cuda as cu
    except Exception as e:  # noqa: BLE001 - the reason is what we report
        return f"{type(e).__name__}: {e}"
    try:
        n = cu.device_count()
    except Exception as e:  # noqa: BLE001
        return f"commlib._C_cuda.device_count(): {type(e).__name__}: {e}"
    return None if n > 0 else "commlib._C_cuda sees no device"


def gpu_verdict(gpus_listed: int, import_error: Optional[str]) -> Tuple[str, str]:
    """("run" | "skip" | "fail", reason) for the @pytest.mark.gpu tests."""
    if import_error is None:
        return "run", ""
    if gpus_listed > 0:
        return "fail", (f"nvidia-smi lists {gpus_listed} GPU(s) but commlib._C_cuda is not usable: "
                        f"{import_error}")
    return "skip", "no CUDA device"
