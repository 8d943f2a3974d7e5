# Helpers of scripts/gpu_check.sh, sourced by it (its globals: PY, dry, emulated, lent, logs, out,
# steps, started, rows, tails, overall, planned, rerun_s, BUDGET and the device budget's terms): the
# environment lines at the top of the report, the report's writer, a step's run under its limit,
# the dry run's arithmetic, and the private MPS daemon.

env_lines() {
  echo "- machine: $(hostname), $(nproc) cores; GPUs:"
  nvidia-smi --query-gpu=index,name,memory.total,driver_version,compute_mode --format=csv,noheader 2>&1 | sed 's/^/  - /'
  echo "- nvcc: $(nvcc --version 2>/dev/null | tail -1 || echo 'not found')"
  echo "- python: $PY = $(command -v "$PY"), $("$PY" -c 'import sys; print(sys.version.split()[0])' 2>&1)"
  timeout 60 "$PY" - <<'EOF' 2>&1 | sed 's/^/- /'
import importlib
try:
    import torch
    print(f"torch {torch.__version__}, torch.version.cuda {torch.version.cuda}, "
          f"cuda available {torch.cuda.is_available()}, devices {torch.cuda.device_count()}")
    try:
        print("NCCL (torch's): " + ".".join(map(str, torch.cuda.nccl.version())))
    except Exception as e:  # noqa: BLE001
        print(f"NCCL (torch's): {type(e).__name__}: {e}")
except Exception as e:  # noqa: BLE001
    print(f"torch: {type(e).__name__}: {e}")
for name in ("cupy", "numba", "mpi4py", "pytest", "pybind11"):
    try:
        m = importlib.import_module(name)
        print(f"{name} {getattr(m, '__version__', '?')}")
    except Exception as e:  # noqa: BLE001
        print(f"{name}: {type(e).__name__}: {e}")
EOF
  if [ -n "$(ls commlib/_C_cuda*.so 2>/dev/null)" ]; then
    timeout 60 "$PY" -c 'from commlib import nccl; v, path = nccl.load(); print("- NCCL (commlib loads): " + ".".join(map(str, v)) + " from " + path)' 2>&1 | tail -1
  fi
}

# predictions_table: docs/gpu.md's table of what --lent measures and the prediction each
# measurement tests (the first table after its "**What `--lent` runs" paragraph), as it stands.
predictions_table() {
  awk '/^\*\*What `--lent` runs/{on=1} on && /^\|/{print; seen=1; next} seen{exit}' "$ROOT/docs/gpu.md"
}

write_report() {
  [ $dry -eq 1 ] && return 0
  {
    echo "# GPU check"
    echo
    echo "Written by \`scripts/gpu_check.sh\` (steps: env,$steps), $(date -u +%Y-%m-%dT%H:%M:%SZ), after $((SECONDS - started)) s."
    echo
    cat "$logs/env.md"
    echo
    echo "| step | what ran | result | seconds |"
    echo "| --- | --- | --- | --- |"
    printf '%s\n' "${rows[@]}"
    # The predictions the measurements below test, as docs/gpu.md wrote them before the run.
    echo
    echo "## The predictions (docs/gpu.md \"Running the GPU check on a lent machine\", written before the run)"
    echo
    predictions_table
    if [ ${#tails[@]} -gt 0 ]; then
      echo
      echo "## Failing steps: the last lines of their logs"
      printf '%s\n' "${tails[@]}"
    fi
    if [ -s "$logs/bench.md" ]; then
      echo
      echo "## Bench"
      echo
      cat "$logs/bench.md"
    fi
    if [ -s "$logs/kept.md" ]; then
      echo
      cat "$logs/kept.md"
    fi
  } > "$out"
  # On a lent machine what comes back is what lies under $OUT: the report, the steps' logs and the
  # bench's JSON, copied after every step (a command cut at its limit still returns them).
  if [ -n "${OUT:-}" ] && [ -d "$OUT" ]; then
    cp "$out" "$OUT/" 2>/dev/null
    tar czf "$OUT/gpu_check_logs.tgz" -C "$logs" . 2>/dev/null
    [ -d "$ROOT/bench/results" ] && tar czf "$OUT/gpu_check_results.tgz" -C "$ROOT" bench/results 2>/dev/null
  fi
}

# dry_summary: the end of a dry run: the steps' limits added up against the script's budget and,
# for the lent machine's command, the device budget (a machine's start, the call's transfers, a
# rerun of RERUN_STEP at once in a second call, the give-back). Exits 1 where the lent plan does not
# fit, so the plan is checked here before a machine is asked for (tests/bench/test_gpu_check_plan.py).
dry_summary() {
  echo "gpu_check: the steps' time limits add up to ${planned}s, within the ${BUDGET}s budget: $([ "$planned" -le "$BUDGET" ] && echo yes || echo NO)"
  [ $lent -eq 1 ] || exit 0
  local total=$((MACHINE_START_S + BUDGET + TRANSFER_S + rerun_s + TRANSFER_S + GIVE_BACK_S))
  echo "gpu_check: on the lent machine: start ${MACHINE_START_S}s + this command ${BUDGET}s + ${TRANSFER_S}s of transfers + a rerun of $RERUN_STEP (${rerun_s}s, --skip-build while warm) + ${TRANSFER_S}s + give-back ${GIVE_BACK_S}s = ${total}s of the ${DEVICE_BUDGET_S}s device budget"
  if [ "$planned" -gt "$BUDGET" ] || [ "$total" -gt "$DEVICE_BUDGET_S" ] || [ "$BUDGET" -gt 590 ] || [ "$rerun_s" -eq 0 ]; then
    echo "gpu_check: the lent plan does not fit (limits over the budget, the device budget exceeded, a budget over one command's 600 s less 10, or no $RERUN_STEP step)" >&2
    exit 1
  fi
  exit 0
}

# run_step NAME BUDGET_S "what ran" command...: runs under timeout (at most what is left of the
# whole budget), records passed / failed (exit) / timed out with the pytest summary line, writes
# the report. Returns the command's status.
run_step() {
  local name=$1 budget=$2 what=$3; shift 3
  # (the limits are a GPU's; host threads on a shared CPU take longer: the emulated check's are 3x)
  [ $emulated -eq 1 ] && budget=$((budget * 3))
  if [ $dry -eq 1 ]; then
    echo "  [$name] (at most ${budget}s) $what"
    echo "      $*"
    planned=$((planned + budget))
    [ "$name" = "$RERUN_STEP" ] && rerun_s=$budget
    return 0
  fi
  local left; left=$(remaining)
  if [ "$left" -lt 20 ]; then
    rows+=("| $name | $what | not run: the ${BUDGET} s budget is spent | 0 |")
    write_report; return 124
  fi
  [ "$budget" -gt "$left" ] && budget=$left
  local log="$logs/$name.log" t0=$SECONDS rc
  echo "gpu_check: [$name] $what (at most ${budget}s)" >&2
  timeout -k 10 "$budget" "$@" > "$log" 2>&1
  rc=$?
  local summary; summary=$(grep -E '(passed|failed|error|skipped|no tests ran)' "$log" | grep -E '^=+ |^[0-9]+ ' | tail -1 | tr -d '=|' | sed 's/^ *//;s/ *$//')
  local result
  case $rc in
    0) result="passed${summary:+: $summary}" ;;
    124|137) result="**timed out** after ${budget} s${summary:+: $summary}" ;;
    *) result="**failed** (exit $rc)${summary:+: $summary}" ;;
  esac
  rows+=("| $name | $what | $result | $((SECONDS - t0)) |")
  if [ $rc -ne 0 ]; then
    overall=1
    tails+=("" "### $name (exit $rc)" "" '```' "$(grep -v '^\s*$' "$log" | tail -40)" '```')
  fi
  write_report
  echo "gpu_check: [$name] $result" >&2
  return $rc
}

# start_mps NAME: a private MPS daemon (pipe and log folders under $logs), so that several ranks'
# kernels run concurrently on one GPU (without it their contexts time-slice and every wait of the
# kernel path lasts a slice). Returns non-zero where it cannot be started; stop_mps stops it.
start_mps() {
  command -v nvidia-cuda-mps-control >/dev/null 2>&1 || return 1
  [ $dry -eq 1 ] && { echo "  (MPS: nvidia-cuda-mps-control -d, pipe under \$logs/$1_pipe; stopped with 'echo quit | nvidia-cuda-mps-control')"; return 0; }
  export CUDA_MPS_PIPE_DIRECTORY=$logs/$1_pipe CUDA_MPS_LOG_DIRECTORY=$logs/$1_log
  mkdir -p "$CUDA_MPS_PIPE_DIRECTORY" "$CUDA_MPS_LOG_DIRECTORY"
  if nvidia-cuda-mps-control -d > "$logs/$1_start.log" 2>&1; then return 0; fi
  unset CUDA_MPS_PIPE_DIRECTORY CUDA_MPS_LOG_DIRECTORY
  return 1
}
stop_mps() {
  [ $dry -eq 1 ] && return 0
  echo quit | nvidia-cuda-mps-control > /dev/null 2>&1
  sleep 1
  unset CUDA_MPS_PIPE_DIRECTORY CUDA_MPS_LOG_DIRECTORY
}
