"""The NCCL loader against a stand-in libnccl built here (no NCCL on CI machines): it resolves
every function, reads the version, names a missing symbol, and lists what it tried when nothing
loads. Each case runs in a fresh interpreter: a process loads NCCL once."""
import os
import shutil
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
FUNCTIONS = ["ncclGetErrorString", "ncclGetUniqueId", "ncclCommInitRank", "ncclCommDestroy", "ncclCommAbort",
             "ncclCommGetAsyncError", "ncclAllReduce", "ncclAllGather", "ncclReduceScatter", "ncclBroadcast", "ncclReduce",
             "ncclSend", "ncclRecv", "ncclGroupStart", "ncclGroupEnd"]


def _fake_nccl(tmp_path, missing=None):
    src = tmp_path / "fake_nccl.c"
    body = ["int ncclGetVersion(int* v) { *v = 22703; return 0; }"]
    body += [f"int {f}(void) {{ return 0; }}" for f in FUNCTIONS if f != missing]
    src.write_text("\n".join(body) + "\n")
    lib = tmp_path / "libnccl.so.2"
    subprocess.run(["gcc", "-shared", "-fPIC", "-o", str(lib), str(src)], check=True)
    return lib


def _load(env):
    code = "import commlib.device.nccl as n\ntry:\n    print(n.load())\nexcept RuntimeError as e:\n    print('ERROR', e)"
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env={**os.environ, **env},
                         capture_output=True, text=True, timeout=60)
    return out.stdout + out.stderr


@pytest.mark.skipif(shutil.which("gcc") is None, reason="needs gcc for the stand-in library")
def test_loader_resolves_functions_and_version(tmp_path):
    lib = _fake_nccl(tmp_path)
    assert _load({"COMMLIB_NCCL_LIBRARY": str(lib)}).strip() == f"((2, 27, 3), '{lib}')"


@pytest.mark.skipif(shutil.which("gcc") is None, reason="needs gcc for the stand-in library")
def test_loader_names_a_missing_symbol(tmp_path):
    lib = _fake_nccl(tmp_path, missing="ncclSend")
    out = _load({"COMMLIB_NCCL_LIBRARY": str(lib)})
    assert "ERROR" in out and "ncclSend" in out, out


def test_loader_lists_what_it_tried(tmp_path):
    out = _load({"COMMLIB_NCCL_LIBRARY": str(tmp_path / "absent.so")})
    assert "ERROR" in out and "absent.so" in out and "COMMLIB_NCCL_LIBRARY" in out, out
