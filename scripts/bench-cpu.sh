#!/bin/bash
# The CPU-triggered latency and bandwidth runs reported in docs/benchmarks.md.
# Usage: scripts/bench-cpu.sh [BIN_DIR]   (default target/release; for
# binaries built elsewhere: their directory). Prints JSON lines, then a table.
set -euo pipefail
bin=${1:-target/release}
out=$(mktemp)
echo "# $(nproc) cores: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs)"
for ranks_as in threads procs; do
  for op in write write-imm send; do
    "$bin/pingpong" --op "$op" --ranks-as "$ranks_as" --sizes 8,4096,1048576 --json | tee -a "$out"
  done
  "$bin/pingpong" --raw --ranks-as "$ranks_as" --sizes 8,4096,1048576 --json | tee -a "$out"
done
"$bin/pingpong" --op write --ranks-as threads --shared-device --sizes 8,4096,1048576 --json | tee -a "$out"
"$bin/bandwidth" --op write --sizes 65536,1048576 --json | tee -a "$out"
"$bin/bandwidth" --op read --sizes 65536,1048576 --json | tee -a "$out"
python3 - "$out" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.startswith("{")]
lat = [r for r in rows if "t_p50_us" in r]
raw = {(r["ranks_as"], r["bytes"]): r["t_p50_us"] for r in lat if r["raw"]}
print("\nhalf round trip, p50 [us] (ratio to --raw of the same ranks and size)")
print(f"{'ranks_as':9} {'link':14} {'op':10} {'bytes':>8} {'p50':>9} {'p99':>9} {'raw p50':>8} {'ratio':>6} {'cpu/iter':>9}")
for r in lat:
    if r["raw"]: continue
    fl = raw.get((r["ranks_as"], r["bytes"]))
    print(f"{r['ranks_as']:9} {r['link']:14} {r['op']:10} {r['bytes']:>8} {r['t_p50_us']:>9.3f} {r['t_p99_us']:>9.3f} {fl:>8.3f} {r['t_p50_us']/fl:>6.1f} {r['cpu_us_per_iter']:>9.3f}")
print("\nbandwidth")
for r in rows:
    if "gbytes_per_s" in r:
        print(f"{r['op']:6} {r['bytes']:>8} {r['gbytes_per_s']:>8.2f} GB/s {r['mmsg_per_s']:>8.4f} Mmsg/s")
PY
rm -f "$out"
