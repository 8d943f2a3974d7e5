"""What the CUDA build where no GPU is listed (COMMLIB_CUDA_ONE_PTX, set by scripts/setup.sh: CI's and
every CPU-only user's) still proves: one PTX compiled for the
first architecture, assembled (and checked for spills by ptxas) for every architecture listed. That
proves every code path only while no source branches on __CUDA_ARCH__'s value: a path for one
architecture alone would be compiled by the README's build and never by CI's."""
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
import build_deps  # noqa: E402  (beside setup.py)

# __CUDA_ARCH__ may only say host or device code: #ifdef / #ifndef / defined(...).
ALLOWED = re.compile(r"^\s*#\s*(ifdef|ifndef)\s+__CUDA_ARCH__\s*(//.*)?$|defined\s*\(?\s*__CUDA_ARCH__\s*\)?")


def arch_dependent_lines(root):
    found = []
    for path in sorted(root.rglob("*")):
        if path.suffix not in (".h", ".cuh", ".cu", ".cc"):
            continue
        for i, line in enumerate(path.read_text(errors="replace").splitlines(), 1):
            code = line.split("//", 1)[0]
            if "__CUDA_ARCH" not in code:
                continue
            rest = ALLOWED.sub("", code)
            if "__CUDA_ARCH" in rest:  # a comparison, __CUDA_ARCH_LIST__, __CUDA_ARCH_SPECIFIC__, ...
                found.append(f"{path.relative_to(root)}:{i}: {line.strip()}")
    return found


def test_no_source_branches_on_the_architecture():
    found = arch_dependent_lines(ROOT / "csrc")
    assert not found, ("code for one GPU architecture alone is not compiled by CI's one-PTX CUDA build "
                       f"(COMMLIB_CUDA_ONE_PTX, .ci/run): build each architecture's PTX in CI instead, or "
                       f"branch on something else: {found}")


def test_the_guard_sees_a_comparison(tmp_path):
    (tmp_path / "k.cuh").write_text("#ifdef __CUDA_ARCH__\n#if defined(__CUDA_ARCH__)\n"
                                    "#if __CUDA_ARCH__ >= 900  // Hopper only\n")
    assert arch_dependent_lines(tmp_path) == ["k.cuh:3: #if __CUDA_ARCH__ >= 900  // Hopper only"]


def test_gencode_by_default_and_with_one_ptx():
    assert build_deps.cuda_gencode(["80", "90"], False) == [
        "-gencode", "arch=compute_80,code=sm_80", "-gencode", "arch=compute_90,code=sm_90",
        "-gencode", "arch=compute_90,code=compute_90"]
    # one front-end run (compute_80), machine code (ptxas, spill checks) for both
    assert build_deps.cuda_gencode(["80", "90"], True) == ["-gencode", "arch=compute_80,code=[sm_80,sm_90]"]
    assert build_deps.cuda_gencode(["90"], True) == ["-gencode", "arch=compute_90,code=[sm_90]"]


def test_the_set_up_builds_with_one_ptx_only_without_a_gpu():
    # (scripts/setup.sh, which CI's .ci/run and both of the README's commands run)
    text = (ROOT / "scripts" / "setup.sh").read_text()
    assert "COMMLIB_CUDA_ONE_PTX=${COMMLIB_CUDA_ONE_PTX-1}" in text and "nvidia-smi -L" in text
