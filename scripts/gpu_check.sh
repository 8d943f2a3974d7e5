#!/usr/bin/env bash
# The GPU check: one command on a lent GPU machine, in bounded steps, each under `timeout`, the
# whole run under GPU_CHECK_BUDGET_S (default 470 s, 590 s with --lent: a lent command may run 10
# minutes, and a lent task has 15 minutes of device time in all: docs/gpu.md "Running the GPU check").
#
#   scripts/gpu_check.sh                  every step
#   scripts/gpu_check.sh --skip-build     reuse commlib/_C*.so from an earlier run
#   scripts/gpu_check.sh --steps gpu,bench   only these steps (env always runs)
#   scripts/gpu_check.sh --lent           the lent machine's one command: the steps that measure
#                                         issues #37's and #38's targets and check what never ran,
#                                         within one command's 10 minutes (GPU_CHECK_BUDGET_S=590)
#   scripts/gpu_check.sh --dry-run        say what would run (every step's command and time limit,
#                                         their sum against the device budget), run nothing;
#                                         without a GPU, as on a machine with one
#   scripts/gpu_check.sh --emulated       no GPU needed: only the bench steps, on the emulated device
#                                         (--device emulated, smaller large sizes), into
#                                         bench/results/gpu_check_emulated.md: checks the bench
#                                         steps' commands and report here; its numbers say nothing
#                                         about a GPU
#
# Steps: env (driver, torch.version.cuda, NCCL version), build (_C and _C_cuda in place with the
# machine's own python3: no venv, no download, no registry), import (commlib._C_cuda must import
# where nvidia-smi lists a GPU: the import error otherwise, and the run stops), torch (commlib._C_torch
# built against this machine's torch imports, and tests/torch/test_cuda_backend.py's GPU cases: CUDA
# tensors through the C++ c10d::Backend, issue #44), kernels (the
# @pytest.mark.gpu kernel tests), kernels_bw (bench/gpu_kernels.py: the reduction kernels' bandwidth
# against the device copy and torch's add_), copy
# (the copy path alone at 4 and 64 MiB in fresh processes, its data operations gated / mirror /
# ungated / driver, 1 and 2 streams, then 1 and 32 hardware queues: the H200's large-message regression,
# docs/gpu.md), latency (bench/gpu_latency.py: where an all_reduce's
# time goes, 4 ranks on GPU 0 under MPS where there is one, both paths, against torch's own round
# trip), staged (the same for buffers no peer can map: torch's cudaMallocAsync backend, so every
# one-sided call stages, in the staging arena against through the slots, 64 and 256 MiB: issue
# #38's >= 0.3x target for the staged path), auto_route (device auto beside its candidates, mapped
# and staged: the cost model's prediction), grid (the one-sided grid from the SM count: the fused
# two-shot at 64 and 256 MiB with COMMLIB_DEVICE_BLOCK_BYTES swept so that one job runs 33, 16 and
# 4 blocks per rank), launch (bench/gpu_launch.py, at GPU_CHECK_LAUNCH_NP ranks, default "4 2 1": issue #37's targets at 4, the 8 B all_reduce's enqueue,
# back-to-back, synchronous and replayed-graph (100 calls) times against torch's add_ and an empty
# kernel launch, the ranks on GPU 0 under MPS; and where there are several GPUs, 2 and 4 ranks one
# per GPU), trace (bench/gpu_trace.py: one traced 64 MiB mapped all_reduce; trace_msg: one two_shot, a message plan; 4 ranks on GPU 0, their
# timeline a Chrome trace in $OUT/gpu_trace, else bench/results/gpu_trace, its step table in the report), sweep (the same at 64 MiB over the inbox's slot size and count), gpu (every other @pytest.mark.gpu test, several ranks on the one GPU, the symmetric pool's on CUDA among them), ranks (tests/stream's and tests/device's CUDA cases again under
# MPS when nvidia-cuda-mps-control exists; skipped otherwise), bench (small and large all_reduce on
# both device paths, kernel and copy, against the device copy bandwidth, under MPS where there is one;
# then reduce_scatter and all_gather 64-256 MiB on the kernel path, mapped and fused among them; against NCCL where there is one GPU per rank, NCCL refusing several ranks on one GPU;
# with one GPU, bench_symm: torch's symmetric-memory all_reduce as a peer column, or torch's refusal).
# bench/RESULTS_gpu.md is rewritten after every step, so a run cut short still reports.
# Without a GPU it says so and stops (exit 0) without touching bench/RESULTS_gpu.md.
set -uo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
PY=${PYTHON:-python3}
BUDGET=${GPU_CHECK_BUDGET_S:-470}
ALL_STEPS="build,import,torch,kernels,kernels_bw,copy,latency,staged,auto_route,grid,launch,trace,trace_msg,sweep,gpu,ranks,bench"
# The lent machine's one command (docs/gpu.md "Running the GPU check on a lent machine"): every
# target of issues #37 and #38 the script measures, and the correctness of what never ran on a GPU,
# with the launch step at the issue's 4 ranks only. Its steps' limits add up to at most its budget
# (the dry run says so, and fails where they do not fit the device budget).
LENT_STEPS="build,import,kernels,copy,staged,launch,trace,gpu,bench"
# The device budget a lent task has (15 minutes, its start and idle waits counted), a machine's
# start (a minute or more: 90 s assumed), the two transfers of a call (20 s each), the give-back,
# and the step a second command reruns at once if it failed or was cut (the machine still warm:
# --skip-build --steps bench): what the dry run adds up.
DEVICE_BUDGET_S=900 MACHINE_START_S=90 TRANSFER_S=20 GIVE_BACK_S=30 RERUN_STEP=bench_large
steps=$ALL_STEPS dry=0 emulated=0 lent=0 planned=0 rerun_s=0 skip_build=0
while [ $# -gt 0 ]; do
  case "$1" in
    --skip-build) skip_build=1 ;;
    --steps) steps=$2; shift ;;
    --steps=*) steps=${1#--steps=} ;;
    --dry-run) dry=1 ;;
    --lent) lent=1 steps=$LENT_STEPS BUDGET=${GPU_CHECK_BUDGET_S:-590} GPU_CHECK_LAUNCH_NP=${GPU_CHECK_LAUNCH_NP:-4} ;;
    --emulated) emulated=1 ;;
    -h|--help) sed -n '2,19p' "$0"; exit 0 ;;
    *) echo "gpu_check: unknown argument $1 (see --help)" >&2; exit 2 ;;
  esac
  shift
done
[ $skip_build -eq 1 ] && steps=${steps//build/}  # (whatever order the options came in)
steps=$(echo "$steps" | tr -s ',' | sed 's/^,//;s/,$//')
wants() { case ",$steps," in *",$1,"*) return 0 ;; esac; return 1; }

gpus=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU' || true)
gpus=${gpus:-0}
device=cuda out=bench/RESULTS_gpu.md
if [ $emulated -eq 1 ]; then
  # The bench steps' commands and report, without a GPU: ranks on emulated device 0 (as ranks
  # sharing one GPU), no MPS, no NCCL peer; the GPU's results file is left alone.
  steps=bench device=emulated gpus=1 out=bench/results/gpu_check_emulated.md
elif [ "$gpus" -eq 0 ] && [ $dry -eq 1 ]; then
  echo "gpu_check: no GPU here (nvidia-smi lists none): the plan as on a machine with one GPU."
  gpus=1
elif [ "$gpus" -eq 0 ]; then
  echo "gpu_check: no GPU here (nvidia-smi lists none): nothing to check; bench/RESULTS_gpu.md left as it is."
  echo "gpu_check: on a GPU machine it would run: env,${steps} with $PY, within ${BUDGET}s (--dry-run shows the commands)."
  exit 0
fi
if [ $dry -eq 1 ]; then
  echo "gpu_check: $gpus GPU(s); would run env,${steps} with $PY ($(command -v "$PY")), within ${BUDGET}s:"
fi

export PYTHONPATH="$ROOT${PYTHONPATH:+:$PYTHONPATH}" PYTHONDONTWRITEBYTECODE=1
logs=/nonexistent  # a dry run writes nothing
[ $dry -eq 0 ] && logs=$(mktemp -d /tmp/gpu_check.XXXXXX)
# What the results file holds that no step writes (bench/launch_cost.py's "## Host cost per call"
# section, measured without a GPU) is kept: copied out once, appended to every rewrite.
if [ $dry -eq 0 ] && [ -f "$out" ]; then
  awk '/^## Host cost per call/{keep=1} keep && /^## / && !/^## Host cost per call/{keep=0} keep' "$out" > "$logs/kept.md"
fi
started=$SECONDS
rows=()     # one table row per step that ran
tails=()    # the tail of each failing step's log
overall=0
remaining() { echo $(( BUDGET - (SECONDS - started) )); }

# env_lines (the report's environment lines), write_report (the report itself), run_step (a step
# under its limit), dry_summary (a dry run's arithmetic), start_mps / stop_mps.
# shellcheck source=scripts/gpu_check_lib.sh
. "$ROOT/scripts/gpu_check_lib.sh"

# Stops a daemon left running when the script is cut short (timeout, ^C).
trap '[ -n "${CUDA_MPS_PIPE_DIRECTORY:-}" ] && [ $dry -eq 0 ] && echo quit | nvidia-cuda-mps-control >/dev/null 2>&1' EXIT

if [ $dry -eq 0 ]; then
  env_lines > "$logs/env.md" 2>&1
  write_report
fi

if wants build; then
  # Only the lent GPU's architecture (COMMLIB_CUDA_ARCHS): half the nvcc time of the default 80,90.
  arch=$(nvidia-smi --query-gpu=compute_cap --format=csv,noheader 2>/dev/null | head -1 | tr -d ' .')
  [ -n "$arch" ] && export COMMLIB_CUDA_ARCHS=${COMMLIB_CUDA_ARCHS:-$arch}
  # The build's longest jobs, one core each (session 31, on CI's 2-core Intel machine): the CUDA plan
  # kernel for sm_90 alone 129 s, 80 s with nvcc's --split-compile=0 on two cores (its optimiser's and
  # ptxas's work spread over threads; ~40 s expected on 16: the step's 120 s was too close without
  # it); the torch backend's files after torch's 107 s precompiled header (~170 s in all), ~60 s
  # as COMMLIB_UNITY_BINDINGS' three unity files (no header; -O3 as before: the glue's -O1,
  # COMMLIB_BINDINGS_O1, is CI's alone, since the launch step times the host path).
  export COMMLIB_UNITY_BINDINGS=1 NVCC_APPEND_FLAGS="${NVCC_APPEND_FLAGS:+$NVCC_APPEND_FLAGS }--split-compile=0"
  if ! run_step build 120 "\`$PY setup.py build_ext --inplace\` (_C, _C_cuda for sm_${COMMLIB_CUDA_ARCHS:-80,90} with --split-compile=0, _C_torch; unity files; $(nproc) jobs)" \
    "$PY" setup.py build_ext --inplace; then
    # _C_torch is built against the machine's torch (another version than CI's): a failure there
    # is recorded above and the rest is checked without it (groups then use the Python backend).
    run_step build_no_torch 120 "the build again without _C_torch (COMMLIB_NO_TORCH_BACKEND=1)" \
      env COMMLIB_NO_TORCH_BACKEND=1 "$PY" setup.py build_ext --inplace \
      || { echo "gpu_check: build failed: stopping"; cat "$out"; exit 1; }
  fi
  if [ $dry -eq 0 ]; then
    env_lines > "$logs/env.md" 2>&1   # now with the NCCL commlib loads
    write_report
  fi
fi

if wants import; then
  # Item 4 of issue #23: a GPU listed and a CUDA module that does not import is a failure with
  # the import error (a driver older than the static CUDA runtime, a missing build), never a skip.
  run_step import 10 "\`import commlib._C_cuda\` and a device count (nvidia-smi lists $gpus GPU(s))" \
    "$PY" -c 'import commlib._C_cuda as cu; n = cu.device_count(); print("devices:", n); assert n > 0, "no device"' \
    || { echo "gpu_check: commlib._C_cuda does not import while nvidia-smi lists $gpus GPU(s):"; tail -20 "$logs/import.log"; cat "$out"; exit 1; }
fi

# A hang must show as one failing test, not eat the step: peers' timeouts of 30 s, 120 s per test.
export COMMLIB_TIMEOUT=${COMMLIB_TIMEOUT:-30}
PYTEST=("$PY" -m pytest -q -ra -p no:cacheprovider --timeout 120)
if wants torch; then
  # Early: the C++ backend's CUDA path has never run on a GPU (docs/torch_backend.md). The module
  # must load with this machine's torch (built by the build step against it), "cuda" must be
  # registered, then the GPU cases (C++ path counted by commlib._C.device_native_counts).
  run_step torch 200 "\`import commlib._C_torch\` against this torch, \"cuda\" registered, and \`pytest -m gpu tests/torch/test_cuda_backend.py\` (CUDA tensors through the C++ backend)" \
    bash -c '"$0" -c "import torch, torch.distributed as dist, commlib.torch, commlib.torch.native as n; m = n.load(); print(\"_C_torch:\", m, \"built for torch\", m and m.built_torch_version, \"running\", torch.__version__); print(\"registered:\", dist.Backend.backend_capability[\"commlib\"]); assert m is not None and \"cuda\" in dist.Backend.backend_capability[\"commlib\"]" && "$@"' \
    "$PY" "${PYTEST[@]}" -m gpu tests/torch/test_cuda_backend.py
fi
if wants kernels; then
  run_step kernels 20 "\`pytest -m gpu tests/kernels\`: the CUDA reduction kernels against the CPU's" \
    "${PYTEST[@]}" -m gpu tests/kernels
fi
if wants kernels_bw; then
  run_step kernels_bw 60 "\`bench/gpu_kernels.py\`: the reduction kernels' bandwidth at 64 and 256 MiB against the device copy and torch's add_" \
    "$PY" bench/gpu_kernels.py
  if [ $dry -eq 0 ] && [ -s "$logs/kernels_bw.log" ]; then
    { echo "### The reduction kernels against the device copy (bench/gpu_kernels.py)"; echo; grep '^|' "$logs/kernels_bw.log"; echo; } >> "$logs/bench.md"
    write_report
  fi
fi
# latency_step NAME BUDGET "what" args...: bench/gpu_latency.py with 4 ranks on GPU 0 (under a private
# MPS daemon where there is one), its table appended to the report's bench section.
latency_step() {
  local name=$1 budget=$2 what=$3 mps_note=""; shift 3
  [ $dry -eq 0 ] && mkdir -p bench/results
  if [ "$gpus" -lt 2 ] && start_mps "mps_$name"; then mps_note=", under MPS"; fi
  run_step "$name" "$budget" "$what$mps_note" "$PY" bench/gpu_latency.py --np 4 --json "bench/results/gpu_$name.json" "$@"
  [ -n "$mps_note" ] && stop_mps
  if [ $dry -eq 0 ] && [ -s "$logs/$name.log" ]; then
    { echo "### $what (bench/gpu_latency.py$mps_note)"; echo; sed -n '/^[0-9]* ranks on/,$p' "$logs/$name.log"; echo; } >> "$logs/bench.md"
    write_report
  fi
}
if wants copy; then
  # The copy path alone, in processes that never ran the kernel path (--paths copy): on the H200
  # (session 14) a 64 MiB ring took 92 ms there, 1.4 ms on the H100 two days before (docs/gpu.md,
  # "The copy path's large-message regression"). Its data operations four ways
  # (COMMLIB_DEVICE_COPY_RECV: gated kernels that read the host stop word per block; the same
  # kernels gated on a device mirror of it, the default since session 31; ungated; plain copies by
  # cudaMemcpyAsync), one and two streams, 4 and 64 MiB: which of the suspects the time follows.
  if [ $lent -eq 1 ]; then
    # --lent's short form (session 31): the hypothesis's test alone, the ring at 4 and 64 MiB, one stream
    latency_step copy 40 "The copy path alone (fresh processes, no kernel path): ring at 4 and 64 MiB, data operations gated / mirror / ungated / driver" \
      --paths copy --sizes 4M,64M --algorithms ring --reps 5 --sweep COMMLIB_DEVICE_COPY_RECV=gated,mirror,ungated,driver
  else
  latency_step copy 180 "The copy path alone (fresh processes, no kernel path): ring and direct at 4 and 64 MiB, data operations gated / mirror / ungated / driver, 1 and 2 streams" \
    --paths copy --sizes 4M,64M --algorithms ring,direct --reps 10 --sweep COMMLIB_DEVICE_COPY_RECV=gated,mirror,ungated,driver \
    --sweep COMMLIB_DEVICE_STREAMS=1,2
  # The hardware queues a process's streams share (CUDA_DEVICE_MAX_CONNECTIONS, 8 by default): a
  # stream blocked in cuStreamWaitValue64 can hold back kernels of another stream on its queue.
  latency_step copy_queues 60 "The copy path's 64 MiB ring with 1 and 32 hardware queues per process (CUDA_DEVICE_MAX_CONNECTIONS)" \
    --paths copy --sizes 64M --algorithms ring --reps 10 --sweep CUDA_DEVICE_MAX_CONNECTIONS=1,32
  fi
fi
if wants latency; then
  # The one-sided (mapped) all_reduces run on the kernel path only (the copy path's rows say it
  # refused them, as does 256 MiB, whose staged buffers exceed the slots): docs/gpu.md "One-sided plans".
  latency_step latency 120 "Where the time goes: 8 B .. 256 MiB all_reduce, kernel and copy paths, four clocks per call (sync, loop, GPU events, enqueue) against torch's own 8 B add_ and device copy" \
    --algorithms direct,two_shot,ring,mapped_one_shot,mapped_two_shot,mapped_fused_two_shot
fi
if wants staged; then
  # Issue #38's staged path: memory without a shareable handle (torch's cudaMallocAsync backend: a
  # stream-ordered pool, not IPC-capable), so every rank's one-sided calls stage. The staging arena
  # (COMMLIB_DEVICE_STAGING=pool: no size bound, no closing handshake) against the slots (256 MiB
  # exceeds them: that row says it was refused). Never run on a GPU; docs/gpu.md has its prediction.
  export PYTORCH_CUDA_ALLOC_CONF=backend:cudaMallocAsync
  # (the fused two-shot alone, auto's staged choice: the target's; the others staged are auto_route's)
  latency_step staged 35 "The staged path (cudaMallocAsync tensors, no peer maps them): 64 and 256 MiB fused two-shot all_reduce staged in the arena and through the slots" \
    --paths kernel --sizes 64M,256M --reps 10 --algorithms mapped_fused_two_shot \
    --sweep COMMLIB_DEVICE_STAGING=pool,slots
  unset PYTORCH_CUDA_ALLOC_CONF
fi
if wants auto_route; then  # device auto (policy/device_cost.h) beside every candidate; prediction: docs/gpu.md
  AUTO="--paths kernel --sizes 256K,1M,4M,64M --reps 20 --algorithms auto,direct,two_shot,mapped_one_shot,mapped_two_shot,mapped_fused_two_shot"
  latency_step auto_mapped 120 "Device auto beside its candidates (\`ran\`: its pick), mapped buffers: all_reduce 256 KiB to 64 MiB" $AUTO
  export PYTORCH_CUDA_ALLOC_CONF=backend:cudaMallocAsync
  latency_step auto_staged 180 "Device auto beside its candidates, staged buffers (cudaMallocAsync), the arena and the slots" $AUTO --sweep COMMLIB_DEVICE_STAGING=pool,slots
  unset PYTORCH_CUDA_ALLOC_CONF
fi
if wants grid; then
  # Issue #38's grid from the SM count (session 19): a block per SM within each rank's share, 33
  # per rank with 4 ranks on an H200 (16 before). At 64 MiB the block bytes give 33 (256 KiB: the
  # default), 16 (1 MiB) and 4 (4 MiB) blocks per rank: is the grid the lever (docs/gpu.md's prediction)?
  latency_step grid 120 "The one-sided grid: 64 and 256 MiB mapped_fused_two_shot at COMMLIB_DEVICE_BLOCK_BYTES 256K / 1M / 4M (at 64 MiB: 33 / 16 / 4 blocks per rank on an H200)" \
    --paths kernel --sizes 64M,256M --reps 10 --algorithms mapped_fused_two_shot \
    --sweep COMMLIB_DEVICE_BLOCK_BYTES=262144,1048576,4194304
fi
if wants launch; then
  # Issue #37's launch targets (bench/gpu_launch.py): its own table, as latency_step's.
  [ $dry -eq 0 ] && mkdir -p bench/results
  launch_limit=30; [ $lent -eq 1 ] && launch_limit=20  # (session 14: 9-10 s a rank count)
  launch_run() {  # name, ranks, what, extra arguments of bench/gpu_launch.py
    local name=$1 np_=$2 what=$3
    shift 3
    run_step "$name" $launch_limit "Issue #37's launch targets: 8 B all_reduce enqueue, back-to-back, synchronous and a replayed graph of 100 calls against torch's add_ and an empty kernel, $what" \
      "$PY" bench/gpu_launch.py --np "$np_" --json "bench/results/gpu_$name.json" "$@"
    if [ $dry -eq 0 ] && [ -s "$logs/$name.log" ]; then
      { echo "### Launch targets, $what (bench/gpu_launch.py)"; echo; sed -n '/^[0-9]* ranks\{0,1\} on/,$p' "$logs/$name.log"; echo; } >> "$logs/bench.md"
      write_report
    fi
  }
  # Several ranks on GPU 0, under MPS where there is one (without it their kernels time-slice).
  # GPU_CHECK_LAUNCH_NP: the rank counts timed ("1 2 4" separates the kernel's cross-rank waits
  # from its fixed cost: docs/gpu.md "The GPU time of one call"); 4 is the issue's target's shape.
  mps_note=""
  if start_mps mps_launch; then mps_note=", under MPS"; fi
  for np_ in ${GPU_CHECK_LAUNCH_NP:-4 2 1}; do
    name=launch; [ "$np_" != 4 ] && name=launch_np$np_
    launch_run $name "$np_" "$np_ rank(s) on GPU 0$mps_note"
  done
  [ -n "$mps_note" ] && stop_mps
  # One rank per GPU where there are several (2, and 4 where there are 4): the same call without
  # MPS between the ranks' kernels, each block on a GPU of its own (peers' memory over NVLink).
  for np_ in 2 4; do
    [ "$gpus" -ge "$np_" ] || continue
    launch_run launch_per_gpu_np$np_ "$np_" "$np_ ranks, one per GPU" --per-gpu
  done
fi
if wants trace || wants trace_msg; then  # issue #38 item 6; docs/gpu.md "The trace" has the per-block model's predictions
  # Each trace one folder under $OUT: the run tool brings back files at most two folders down
  # (session 31's $OUT/gpu_trace/two_shot/trace.json did not come back).
  trace_dir=${OUT:-$ROOT/bench/results}/gpu_trace msg_trace_dir=${OUT:-$ROOT/bench/results}/gpu_trace_msg mps_note=""
  if [ "$gpus" -lt 2 ] && start_mps mps_trace; then mps_note=", under MPS"; fi
  wants trace && run_step trace $((lent ? 20 : 30)) "One 64 MiB mapped_fused_two_shot all_reduce traced (COMMLIB_DEVICE_TRACE=1), 4 ranks on GPU 0$mps_note: the timeline in $trace_dir/trace.json" \
    "$PY" bench/gpu_trace.py --np 4 --size 64M --out "$trace_dir"
  # a message plan's trace too (session 17): where the staged two_shot's time goes, step by step
  wants trace_msg && run_step trace_msg 30 "One 64 MiB two_shot all_reduce (a message plan) traced, 4 ranks on GPU 0$mps_note: $msg_trace_dir/trace.json" \
    "$PY" bench/gpu_trace.py --np 4 --size 64M --algorithm two_shot --out "$msg_trace_dir"
  [ -n "$mps_note" ] && stop_mps
  for t in trace trace_msg; do
    [ $dry -eq 0 ] && [ -s "$logs/$t.log" ] && { echo "### The $t step's traced 64 MiB all_reduce (bench/gpu_trace.py$mps_note)"; echo
      sed -n '/^[0-9]* ranks on/,$p' "$logs/$t.log"; echo; } >> "$logs/bench.md" && write_report
  done
fi
if wants sweep; then
  latency_step sweep 150 "The inbox's slot size and count at 64 MiB, kernel and copy paths" \
    --sizes 64M --algorithms two_shot,ring,direct --sweep COMMLIB_DEVICE_SLOT_BYTES=262144,1048576,4194304 \
    --sweep COMMLIB_DEVICE_SLOTS=4,8
fi
if wants gpu; then
  # tests/device/test_symmetric_cuda.py (issue #38 item 1's symmetric pool on CUDA, never run on a
  # GPU; ~10 s) is among the first modules collected (tests/device).
  # (55 tests in session 31, in 62 s with their pools cached; session 14's 36 took 70 s)
  run_step gpu 170 "\`pytest -m gpu tests/ --ignore=tests/kernels\`: every other @pytest.mark.gpu test (device buffers and the symmetric pool on CUDA, the stream engine with 2 and 4 ranks on GPU 0, torch backend, parallel), no MPS" \
    "${PYTEST[@]}" -m gpu tests/ --ignore=tests/kernels
fi

if wants ranks; then
  if command -v nvidia-cuda-mps-control >/dev/null 2>&1; then
    if start_mps mps; then
      run_step ranks 120 "\`pytest -m gpu tests/stream tests/device\` again under MPS (several ranks on the one GPU)" \
        "${PYTEST[@]}" -m gpu tests/stream tests/device
      stop_mps
    else
      rows+=("| ranks | MPS | not run: nvidia-cuda-mps-control -d failed: $(tail -1 "$logs/mps_start.log") | 0 |")
      write_report
    fi
  else
    [ $dry -eq 1 ] && echo "  [ranks] not run: no nvidia-cuda-mps-control here"
    rows+=("| ranks | under MPS | not run: no nvidia-cuda-mps-control here (the gpu step ran the ranks without MPS) | 0 |")
    write_report
  fi
fi

if wants bench; then
  np=$gpus peers=(--peers nccl) note="NCCL through the same libnccl, one GPU per rank"
  if [ "$gpus" -lt 2 ]; then
    np=2 peers=(--peers none) note="no NCCL peer: NCCL refuses several ranks on one GPU (Duplicate GPU); ours only, 2 ranks on GPU 0"
  fi
  [ "$np" -gt 8 ] && np=8
  # Both paths of the stream engine side by side (--paths: kernel, copy, and which one auto ran),
  # against the device-to-device copy bandwidth measured in the same job (docs/gpu.md, "Paths in
  # the bench"). Few algorithms so that both sizes fit the budget; the one-sided ones run as
  # `@kernel` only, and a size whose staged buffers exceed the slots leaves them out, saying so. Several ranks on one GPU time-slice
  # without MPS (every kernel-path wait lasts a slice), so the bench runs under a private MPS daemon
  # where there is one, and says so.
  common=(all_reduce --device "$device" --np "$np" --mode in -n 10 -w 3 --passes 1 --timeout 60
          --algorithms ring,direct,two_shot,mapped_one_shot,mapped_two_shot,mapped_fused_two_shot,auto --paths kernel,copy,auto "${peers[@]}")
  large=(-b 64M -e 256M -f 4) large_what="64 MiB .. 256 MiB" tag=gpu_bench
  if [ $emulated -eq 1 ]; then  # host threads copying host memory on a busy CPU: smaller
    large=(-b 1M -e 4M -f 4) large_what="1 MiB .. 4 MiB (emulated: smaller)" tag=gpu_check_emulated
    note="emulated device 0 shared by the ranks; no NCCL peer; says nothing about a GPU"
  fi
  mps=""
  if [ "$gpus" -lt 2 ] && [ $emulated -eq 0 ] && start_mps mps_bench; then
    # Under MPS the issue's small-message target's shape: 4 ranks on the one GPU.
    mps=", under MPS" np=4 note="no NCCL peer: NCCL refuses several ranks on one GPU (Duplicate GPU); ours only, 4 ranks on GPU 0"
    common[4]=$np
  fi
  [ $dry -eq 0 ] && mkdir -p bench/results
  run_step bench_small $((lent ? 20 : 25)) "all_reduce 16 B .. 1 MiB (issue #38's one-shot target from 64 KiB), $np ranks ($note$mps), kernel and copy paths" \
    "$PY" -m commlib bench "${common[@]}" -b 16 -e 1M -f 4 --json "bench/results/${tag}_small.json"
  # --lent: the kernel path alone at the large sizes (session 14's bench_large timed out on the copy
  # path's 90-320 ms calls: "The copy path's large-message regression"; the copy step times that path)
  large_cmd=("${common[@]}") large_paths="kernel and copy paths" large_limit=80
  [ $lent -eq 1 ] && large_cmd[18]=kernel large_paths="kernel path (the copy path: the copy step)" large_limit=50
  run_step bench_large $large_limit "all_reduce $large_what, $np ranks ($note$mps), $large_paths" \
    "$PY" -m commlib bench "${large_cmd[@]}" "${large[@]}" --json "bench/results/${tag}_large.json"
  # Issue #38's other targets: reduce_scatter and all_gather on mapped buffers >= 0.8x a copy at
  # 256 MiB (docs/gpu.md "Prediction for the fused reduce_scatter and the all_gather"), kernel path.
  for coll in reduce_scatter all_gather; do
    algos=ring,mapped,auto; [ $coll = reduce_scatter ] && algos=ring,mapped,mapped_fused,auto
    run_step "bench_$coll" $((lent ? 30 : 35)) "$coll $large_what, $np ranks ($note$mps), kernel path" \
      "$PY" -m commlib bench $coll "${common[@]:1:14}" --algorithms $algos --paths kernel "${peers[@]}" "${large[@]}" \
      --json "bench/results/${tag}_$coll.json"
  done
  # Issue #38's peer column: torch's symmetric-memory all_reduce (one_shot, two_shot) with the same
  # ranks on the one GPU and the bench steps' sizes, beside commlib's mapped all_reduce in the same
  # job (bench/gpu_symm.py); where torch refuses several ranks on one GPU its rows say why. One
  # GPU only (with several, the bench's ranks each have a GPU and NCCL is the peer); not emulated.
  if [ $emulated -eq 0 ] && [ "$gpus" -lt 2 ]; then
    run_step bench_symm $((lent ? 20 : 25)) "torch's symmetric-memory all_reduce (one_shot, two_shot; TORCH_SYMM_MEM_ALLOW_OVERLAPPING_DEVICES=1) at the bench's sizes beside commlib's mapped_one_shot and mapped_fused_two_shot, $np ranks on GPU 0$mps" \
      "$PY" bench/gpu_symm.py --np "$np" --reps 10 --json "bench/results/${tag}_symm.json"
    if [ $dry -eq 0 ] && [ -s "$logs/bench_symm.log" ]; then
      { echo "### torch's symmetric-memory all_reduce beside commlib's mapped one (bench/gpu_symm.py$mps)"; echo
        sed -n "/^torch's symmetric-memory/,\$p" "$logs/bench_symm.log"; echo; } >> "$logs/bench.md"
      write_report
    fi
  fi
  [ -n "$mps" ] && stop_mps
  [ $dry -eq 1 ] && dry_summary
  for f in small large reduce_scatter all_gather; do
    j=bench/results/${tag}_$f.json
    if [ -s "$j" ]; then
      { echo "### $f sizes$mps"; echo; timeout 60 "$PY" -m commlib.bench.device "$j" 2>&1; echo; } >> "$logs/bench.md"
    fi
  done
  write_report
fi

[ $dry -eq 1 ] && dry_summary
echo "gpu_check: wrote $out ($((SECONDS - started)) s); logs in $logs"
cat "$out"
exit $overall
