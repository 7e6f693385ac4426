#!/bin/bash
# The bandwidth sweep (1 B to 8 MiB) for every op x memory x trigger, as JSON lines in OUT, and
# a summary (peak GB/s, message rate at 8 B). Combinations that need a GPU (--mem device,
# --trigger stream|kernel) are skipped where nvidia-smi finds none. Each run has a time limit.
# Usage, from the repository root:
#   scripts/bench-bandwidth.sh [BIN_DIR] [OUT]
#     BIN_DIR: target/release, or the directory of binaries built elsewhere
#     OUT: default bandwidth.jsonl
# Plot: python3 scripts/plot.py bandwidth OUT -o bandwidth.png --machine "..."
#
#   scripts/bench-bandwidth.sh --staged-vs-host [BIN_DIR] [OUT]
#     RDMA writes of 64 KiB, 1 MiB and 8 MiB from the cpu, stream and kernel triggers (TRIGGERS
#     chooses: TRIGGERS=kernel), host memory and staged GPU memory (--staging on --check)
#     alternating, REPS times (default 3); prints the median GB/s per trigger and memory at each
#     size and staged / host (the goal at 1 MiB is at least 0.70). Needs a GPU. STAGE_ARGS adds
#     arguments to the staged runs (--chunk 512K ...).
set -euo pipefail
# One bandwidth run with the arguments given, its rows appended to $out (or a FAILED line).
run_bw() {
  timeout "${RUN_TIMEOUT:-300}" "$bin/bandwidth" --json "$@" | tee -a "$out" \
    || echo "# FAILED: $*" | tee -a "$out"
}
if [ "${1:-}" = --staged-vs-host ]; then
  shift
  bin=${1:-target/release}
  out=${2:-staged-vs-host.jsonl}
  : > "$out"
  nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | sed 's/^/# /' | tee -a "$out"
  for rep in $(seq "${REPS:-3}"); do
    for trig in ${TRIGGERS:-cpu stream kernel}; do
      for mem in host device; do
        extra=""
        [ $mem = device ] && extra="--staging on --check ${STAGE_ARGS:-}"
        echo "# rep $rep" >> "$out"
        # shellcheck disable=SC2086
        run_bw --op write --mem $mem --trigger $trig --sizes 64K,1M,8M $extra
      done
    done
  done
  python3 - "$out" <<'PY'
import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.startswith("{")]
print("\nmedian GB/s (10^9 B/s) of RDMA writes; staged = --mem device --staging on")
print(f"{'trigger':8} {'bytes':>9} {'host':>8} {'staged':>8} {'staged/host':>12} {'runs':>5}")
for trig in [t for t in ["cpu", "stream", "kernel"] if any(r["trigger"] == t for r in rows)]:
    for size in sorted({r["bytes"] for r in rows}):
        med = {}
        for mem in ["host", "device"]:
            v = [r["gbytes_per_s"] for r in rows
                 if (r["trigger"], r["mem"], r["bytes"]) == (trig, mem, size)]
            med[mem] = (statistics.median(v), len(v)) if v else (float("nan"), 0)
        (h, n), (d, _) = med["host"], med["device"]
        print(f"{trig:8} {size:>9} {h:8.3f} {d:8.3f} {d / h if h else float('nan'):12.3f} {n:>5}")
PY
  exit 0
fi
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
      # shellcheck disable=SC2086
      run_bw --op $op --mem $mem --trigger $trig ${EXTRA:-}
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
