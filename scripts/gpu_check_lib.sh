# Helpers of scripts/gpu_check.sh, sourced by it (its globals: PY, dry, logs, out, steps, started,
# rows, tails): the environment lines at the top of the report, and the report's writer.

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
}
