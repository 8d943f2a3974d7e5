#!/usr/bin/env bash
# One command on a GPU machine: build (with nvcc), run the GPU tests and the device-engine tests,
# the GPU bench (our algorithms against NCCL, commlib/bench/device.py), and write
# bench/RESULTS_gpu.md (machine, results, the issue's targets and what is not measured).
set -uo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh || exit 1
out=bench/RESULTS_gpu.md
log=$(mktemp)
{
  echo "# GPU check"
  echo
  echo "Run $(date -u +%Y-%m-%dT%H:%MZ) on $(hostname) by scripts/gpu_check.sh."
  echo
  echo '```'
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv 2>&1 || echo "nvidia-smi: not available"
  nvcc --version 2>&1 | tail -1 || true
  echo '```'
} > "$out"
.venv/bin/python -m pytest -q -ra -m gpu tests/ > "$log" 2>&1
gpu_rc=$?
.venv/bin/python -m pytest -q -ra tests/device > "$log.device" 2>&1
dev_rc=$?
# The GPU bench: our algorithms against NCCL through the same libnccl (--peers nccl), 8 ranks
# (one per GPU where there are 8; several per GPU otherwise: our ipc link takes that, NCCL refuses
# it, and its rows are then missing), all_reduce 8 B .. 1 GiB, the other collectives to 64 MiB.
ngpu=$(nvidia-smi -L 2>/dev/null | wc -l)
mkdir -p bench/results
bench_json=bench/results/gpu_bench.json
.venv/bin/python -m commlib bench all_reduce --device cuda --np 8 -b 8 -e 1G -f 4 --mode in -n 10 --passes 1 \
  --peers nccl --timeout 3000 --json "$bench_json" > "$log.bench" 2>&1
bench_rc=$?
.venv/bin/python -m commlib bench all_gather reduce_scatter broadcast all_to_all --device cuda --np 8 -b 8 -e 64M \
  -f 8 -n 10 --passes 1 --peers nccl --timeout 3000 --json bench/results/gpu_bench_others.json > "$log.others" 2>&1
others_rc=$?
{
  echo
  echo "## Tests"
  echo
  echo "- \`pytest -m gpu tests/\` (CUDA kernels and every @pytest.mark.gpu test): exit $gpu_rc, $(tail -1 "$log")"
  echo "- \`pytest tests/device\` (stream engine on the emulated device): exit $dev_rc, $(tail -1 "$log.device")"
  echo
  echo "## Bench: our algorithms against NCCL ($ngpu GPU(s), 8 ranks)"
  echo
  echo "all_reduce: exit $bench_rc; the other collectives: exit $others_rc (logs: the last lines below)."
  echo
  if [ -s "$bench_json" ]; then .venv/bin/python -m commlib.bench.device "$bench_json"; else echo '```'; tail -20 "$log.bench"; echo '```'; fi
  echo
  if [ -s bench/results/gpu_bench_others.json ]; then
    .venv/bin/python -m commlib.bench.device bench/results/gpu_bench_others.json | grep -v '^| our best all_reduce'
  else
    echo '```'; tail -20 "$log.others"; echo '```'
  fi
  echo
  echo "## Targets of issue #14"
  echo
  echo "The two all_reduce targets are judged in the bench's table above (8 ranks: on one node of 8 GPUs they"
  echo "are the issue's; on fewer GPUs NCCL cannot run 8 ranks and they stay not measured)."
  echo "4 ranks on one GPU running every collective: the @pytest.mark.gpu tests above (tests/device/test_cuda_buffers.py)."
} >> "$out"
echo "wrote $out"
cat "$out"
[ $gpu_rc -eq 0 ] || [ $gpu_rc -eq 5 ] && [ $dev_rc -eq 0 ] && [ $bench_rc -eq 0 ]
