#!/usr/bin/env bash
# Small-message TCP latency against Open MPI (tcp btl), 2 hosts x 1 rank over real TCP between two
# network namespaces (root only), as recorded in bench/RESULTS_multihost.md ("Small messages").
#
#   bench/tcp_latency.sh [RUNS] [PASSES] [-- VAR=VALUE ...]
#
# Runs `commlib bench all_reduce` RUNS times (default 3), each with PASSES passes (default 3:
# commlib and MPI take turns, each row keeps its lowest median over passes), 8 B and 8 KiB float32
# sum, out of place, auto's algorithm. Settings after `--` go to commlib's ranks (e.g.
# COMMLIB_TCP_SPIN_US=0 to see the default's effect). Prints one line per run and size: commlib's
# and MPI's time (lowest median over passes, then every pass's median), their ratio and the load.
set -euo pipefail
cd "$(dirname "$0")/.."
RUNS=${1:-3}
PASSES=${2:-3}
shift $(( $# > 2 ? 2 : $# ))
[ "${1:-}" = "--" ] && shift
scripts/install_mpi.sh || { echo "tcp_latency: Open MPI is needed (scripts/install_mpi.sh)" >&2; exit 1; }
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
for run in $(seq 1 "$RUNS"); do
  load=$(cut -d' ' -f1 /proc/loadavg)
  env "$@" .venv/bin/commlib bench all_reduce --np 2 --hosts 2 --netns -b 8 -e 8192 -f 1024 \
    --algorithms auto --peers mpi --passes "$PASSES" --mode out --json "$out/run$run.json" >"$out/run$run.log" 2>&1 \
    || { cat "$out/run$run.log" >&2; exit 1; }
  .venv/bin/python - "$out/run$run.json" "$run" "$load" "$(cut -d' ' -f1 /proc/loadavg)" <<'EOF'
import json, sys
d = json.load(open(sys.argv[1]))
rows = {(r["backend"], r["bytes"]): r for r in d["results"]}
for size in (8, 8192):
    c, m = rows[("commlib", size)], rows[("mpi", size)]
    fmt = lambda r: f'{r["time_us"]["median"]:7.2f} us (passes {", ".join(f"{x:.1f}" for x in r["pass_medians_us"])})'
    print(f'run {sys.argv[2]}  {size:5d} B  commlib {fmt(c)}  mpi {fmt(m)}  '
          f'mpi/commlib {m["time_us"]["median"] / c["time_us"]["median"]:.2f}x  [{c["resolved"]}]  '
          f'load {sys.argv[3]} -> {sys.argv[4]}')
EOF
done
