#!/bin/bash
# The soft device on few cores: pingpong's default run (RDMA write, CPU trigger, sizes 8 B to
# 1 MiB, two ranks as threads, then as processes) against its --raw floor measured in the same run
# (--vs-raw: blocks of round trips alternate between the soft device and direct stores),
# with the process pinned to CORES (taskset), REPS times. Prints JSON lines, then medians.
# Usage: scripts/bench-cores.sh CORES [REPS] [BIN_DIR]
#   scripts/bench-cores.sh 0,1          # two cores
#   scripts/bench-cores.sh 0-15 3 path/to/examples   # sixteen, binaries built elsewhere
set -euo pipefail
cores=${1:?usage: scripts/bench-cores.sh CORES [REPS] [BIN_DIR]}
reps=${2:-3}
bin=${3:-target/release}
out=$(mktemp)
echo "# cores $cores of $(nproc): $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs)"
for rep in $(seq "$reps"); do
  for ranks_as in threads procs; do
    taskset -c "$cores" "$bin/pingpong" --vs-raw --ranks-as "$ranks_as" --json |
      sed "s/^{/{\"rep\":$rep,/" | tee -a "$out"
  done
done
python3 - "$out" <<'PY'
import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.startswith("{")]
med = lambda v: statistics.median(v) if v else float("nan")
print("\nhalf round trip [us], medians over repetitions; p50/raw: median of each run's ratio")
print(f"{'ranks_as':9} {'progress':9} {'bytes':>7} {'p50':>8} {'p99':>8} {'raw p50':>8} {'p50/raw':>8} {'range':>10}")
for ranks_as in ("threads", "procs"):
    for b in sorted({r["bytes"] for r in rows}):
        sel = [r for r in rows if r["ranks_as"] == ranks_as and r["bytes"] == b]
        if not sel:
            continue
        p50, p99 = med([r["t_p50_us"] for r in sel]), med([r["t_p99_us"] for r in sel])
        raw, x = med([r["raw_p50_us"] for r in sel]), med([r["p50_over_raw"] for r in sel])
        lo, hi = min(r["p50_over_raw"] for r in sel), max(r["p50_over_raw"] for r in sel)
        print(f"{ranks_as:9} {sel[0].get('progress', '-'):9} {b:>7} {p50:>8.3f} {p99:>8.3f} {raw:>8.3f} {x:>8.1f} {lo:>4.1f}-{hi:<4.1f}")
PY
rm -f "$out"
