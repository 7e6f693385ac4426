#!/bin/bash
# The bandwidth sweep (1 B to 8 MiB) for every op x memory x trigger, as JSON lines in OUT, and
# a summary (peak GB/s, message rate at 8 B). Combinations that need a GPU (--mem device,
# --trigger stream|kernel) are skipped where nvidia-smi finds none. Each run has a time limit.
# Usage, from the repository root:
#   scripts/bench-bandwidth.sh [BIN_DIR] [OUT]
#     BIN_DIR: target/release, or the directory of binaries built elsewhere
#     OUT: default bandwidth.jsonl
# Plot: python3 scripts/plot.py bandwidth OUT -o bandwidth.png --machine "..."
set -euo pipefail
bin=${1:-target/release}
out=${2:-bandwidth.jsonl}
: > "$out"
gpu=0
if nvidia-smi -L >/dev/null 2>&1; then
  gpu=1
  nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | sed 's/^/# /' | tee -a "$out"
fi
echo "# $(nproc) cores: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //')" | tee -a "$out"
for op in write read send; do
  for mem in host device; do
    for trig in cpu stream kernel; do
      if [ $gpu = 0 ] && { [ $mem = device ] || [ $trig != cpu ]; }; then
        echo "# skipped (no GPU): --op $op --mem $mem --trigger $trig" | tee -a "$out"
        continue
      fi
      timeout "${RUN_TIMEOUT:-300}" "$bin/bandwidth" --op $op --mem $mem --trigger $trig \
        --json ${EXTRA:-} | tee -a "$out" \
        || echo "# FAILED: --op $op --mem $mem --trigger $trig" | tee -a "$out"
    done
  done
done
python3 - "$out" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.startswith("{")]
keys = sorted({(r["op"], r["mem"], r["trigger"]) for r in rows},
              key=lambda k: (["write", "read", "send"].index(k[0]), k[1], ["cpu", "stream", "kernel"].index(k[2])))
print("\npeak bandwidth (GB/s = 10^9 B/s) at its size; message rate at 8 B (million messages/s)")
print(f"{'op':6} {'mem':7} {'trigger':8} {'peak GB/s':>10} {'at bytes':>9} {'Mmsg/s 8 B':>11}")
for k in keys:
    sel = [r for r in rows if (r["op"], r["mem"], r["trigger"]) == k]
    peak = max(sel, key=lambda r: r["gbytes_per_s"])
    small = [r["mmsg_per_s"] for r in sel if r["bytes"] == 8]
    rate = f"{small[0]:11.4f}" if small else f"{'-':>11}"
    print(f"{k[0]:6} {k[1]:7} {k[2]:8} {peak['gbytes_per_s']:10.3f} {peak['bytes']:>9} {rate}")
PY
