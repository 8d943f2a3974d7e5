"""The GPU tests' skip logic (tests/gpu_presence.py, issue #23 item 4): a GPU that nvidia-smi lists
with a CUDA module that does not import fails with the import error instead of skipping."""
import subprocess

from gpu_presence import gpu_verdict, listed_gpus


def test_listed_gpus_counts_nvidia_smi_lines():
    def fake_run(argv, **kw):
        return subprocess.CompletedProcess(argv, 0, stdout="GPU 0: NVIDIA H200 (UUID: GPU-1)\n"
                                                          "GPU 1: NVIDIA H200 (UUID: GPU-2)\n")
    assert listed_gpus(fake_run, lambda name: "/usr/bin/nvidia-smi") == 2
    assert listed_gpus(fake_run, lambda name: None) == 0

    def failing_run(argv, **kw):
        raise subprocess.TimeoutExpired(argv, 30)
    assert listed_gpus(failing_run, lambda name: "/usr/bin/nvidia-smi") == 0


def test_a_listed_gpu_without_the_cuda_module_fails_loudly():
    err = "ImportError: CUDA driver version is insufficient for CUDA runtime version"
    verdict, reason = gpu_verdict(1, err)
    assert verdict == "fail" and err in reason and "nvidia-smi lists 1 GPU" in reason
    assert gpu_verdict(0, err) == ("skip", "no CUDA device")
    assert gpu_verdict(1, None) == ("run", "")
