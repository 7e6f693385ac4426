#!/bin/bash
# The GPU-trigger latency runs reported in docs/benchmarks.md (needs a CUDA GPU and NVRTC).
# Usage:
#   scripts/bench-gpu.sh [BIN_DIR]                 one build (the directory of the built examples)
#   scripts/bench-gpu.sh BEFORE_DIR AFTER_DIR [REPS]
#                                                  two builds side by side on the same GPU:
#                                                  REPS (default 3) repetitions, the builds
#                                                  alternating within each, medians and ranges
# Rows: host, stream and kernel triggers; write (8 B and 4 KiB) with each one's --raw floor,
# send and write-imm (8 B), and GPU memory (--mem device). ITERS (5000; 2000 for GPU memory)
# sets the round trips per run.
set -euo pipefail
iters=${ITERS:-5000}
dev_iters=${ITERS:-2000}
out=$(mktemp)
trap 'rm -f "$out"' EXIT

# One pass of every row with the build in $1; each JSON row gets "build": $2 and "rep": $3.
pass() {
  local bin=$1 build=$2 rep=$3
  run() { "$bin/pingpong" "$@" --json | grep '^{' | sed "s/^{/{\"build\":\"$build\",\"rep\":$rep,/" | tee -a "$out"; }
  for trig in host stream kernel; do
    run --trigger $trig --sizes 8,4096 --iters "$iters"
    run --trigger $trig --raw --sizes 8,4096 --iters "$iters"
    run --trigger $trig --op send --sizes 8 --iters "$iters"
    run --trigger $trig --mem device --sizes 8,4096 --iters "$dev_iters"
  done
  for trig in stream kernel; do
    run --trigger $trig --op write-imm --sizes 8 --iters "$iters"
  done
}

nvidia-smi --query-gpu=name,driver_version --format=csv,noheader 2>/dev/null | sed 's/^/# /' || true
if [ $# -ge 2 ]; then
  before=$1 after=$2 reps=${3:-3}
  for rep in $(seq 1 "$reps"); do
    # Alternate which build goes first, so neither always runs on a warmer machine.
    if [ $((rep % 2)) -eq 1 ]; then order="before after"; else order="after before"; fi
    for b in $order; do
      if [ "$b" = before ]; then pass "$before" before "$rep"; else pass "$after" after "$rep"; fi
    done
  done
else
  pass "${1:-target/release}" this 1
fi

python3 - "$out" <<'PY'
import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.startswith("{")]
builds = [b for b in ("this", "before", "after") if any(r["build"] == b for r in rows)]
def key(r): return (r["trigger"], r["op"], r["mem"], r["raw"], r["bytes"])
p50 = {}
for r in rows:
    p50.setdefault((r["build"],) + key(r), []).append(r["t_p50_us"])
med = {k: statistics.median(v) for k, v in p50.items()}
def cell(b, k):
    v = p50.get((b,) + k)
    if not v: return f"{'-':>22}"
    return f"{statistics.median(v):8.3f} [{min(v):.2f}-{max(v):.2f}]".rjust(22)
keys = sorted({key(r) for r in rows}, key=lambda k: (k[3], ["host", "stream", "kernel"].index(k[0]), k[1], k[2], k[4]))
last = builds[-1]
print(f"\nhalf round trip, p50 µs: median [min-max] of {max(len(v) for v in p50.values())} runs")
head = f"{'trigger':8} {'op':10} {'mem':7} {'raw':4} {'bytes':>6}" + "".join(f" {b:>22}" for b in builds)
if len(builds) == 2: head += f" {'after/before':>12}"
head += f" {'/raw':>6} {'vs host':>8}"
print(head)
for k in keys:
    trig, op, mem, raw, n = k
    line = f"{trig:8} {op:10} {mem:7} {'raw' if raw else '':4} {n:>6}" + "".join(f" {cell(b, k)}" for b in builds)
    if len(builds) == 2:
        a, b = med.get(("before",) + k), med.get(("after",) + k)
        line += f" {b / a:12.3f}" if a and b else f" {'-':>12}"
    v = med.get((last,) + k)
    fl = med.get((last, trig, "write", "host", True, n))
    line += f" {v / fl:6.2f}" if v and fl and not raw else f" {'-':>6}"
    h = med.get((last, "host", op, mem, False, n))
    line += f" {100 * (1 - v / h):7.0f}%" if v and h and trig != "host" and not raw else f" {'-':>8}"
    print(line)
who = "the after build; " if len(builds) == 2 else ""
print(f"(/raw and vs host: {who}/raw against the same trigger's --raw, host memory;"
      " vs host: how much lower than --trigger host with the same op and memory)")
PY
