#!/usr/bin/env bash
# Issue 42's retune of this machine class's section of commlib/core/tuning.json, in one command:
#
#     bench/retune_machine.sh [RUNS_BEFORE=6] [RUNS_AFTER=3] [DIR=report/retune]
#
# RUNS_BEFORE quiet runs of the main job (scripts/bench.sh's sweep, about 4-5 minutes each on a
# 2-core machine), STREAM_AB_RUNS (default 2) runs of it with --stream-ab (streaming stores never and
# always, a job each: about 4-5 minutes a run), `commlib tune --machine-section` over them all (the section of this machine's CPU
# and core count replaced; the top level and other machines' sections kept), RUNS_AFTER new runs
# with it, then bench/t5_holdout.py and bench/loss_classes.py over each set: the tables
# bench/RESULTS_collectives.md reports (rows below Open MPI, T5 misses, their classes). Nothing
# else may run meanwhile: the ranks' medians are the measurement. The previous tuning file is kept
# as DIR/tuning_before.json; `git diff commlib/core/tuning.json` shows the change. RETUNE_SIZES
# (default the main job's "-b 8 -e 16M -f 4") only for trying the script out on small sizes.
set -euo pipefail
cd "$(dirname "$0")/.."
before=${1:-6} after=${2:-3} dir=${3:-report/retune}
scripts/setup.sh
scripts/install_mpi.sh || true
mkdir -p "$dir"
py=.venv/bin/python
run_set() {  # $1 name, $2 count
  for i in $(seq 1 "$2"); do
    echo "# $1 $i/$2 $(date -u +%T) load $(cut -d' ' -f1 /proc/loadavg)" >&2
    .venv/bin/commlib bench all_reduce all_gather reduce_scatter all_to_all broadcast \
      --np 4 ${RETUNE_SIZES:--b 8 -e 16M -f 4} --peers gloo,mpi --json "$dir/$1_$i.json" > "$dir/$1_$i.log" 2>&1
  done
}
summary() {  # $1 name, $2 count, $3 the table the runs ran with
  local files=()
  for i in $(seq 1 "$2"); do files+=("$dir/$1_$i.json"); done
  echo "## $1 ($2 runs)"
  $py bench/t5_holdout.py "${files[@]}" --table "$3"
  $py bench/loss_classes.py "${files[@]}" --mpi-margin 1.0
}
cp commlib/core/tuning.json "$dir/tuning_before.json"
run_set before "$before"
files=()
for i in $(seq 1 "$before"); do files+=("$dir/before_$i.json"); done
for i in $(seq 1 "${STREAM_AB_RUNS:-2}"); do  # the section's "stream" entries (commlib/bench/stream_tuning.py)
  echo "# stream_ab $i $(date -u +%T)" >&2
  .venv/bin/commlib bench all_reduce all_gather reduce_scatter all_to_all broadcast \
    --np 4 ${RETUNE_SIZES:--b 8 -e 16M -f 4} --peers mpi --stream-ab --json "$dir/stream_ab_$i.json" > "$dir/stream_ab_$i.log" 2>&1
  files+=("$dir/stream_ab_$i.json")
done
.venv/bin/commlib tune "${files[@]}" -o commlib/core/tuning.json --machine-section
run_set after "$after"
{ summary before "$before" "$dir/tuning_before.json"; summary after "$after" commlib/core/tuning.json; } | tee "$dir/summary.md"
echo "# summary: $dir/summary.md" >&2
