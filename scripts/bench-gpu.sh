#!/bin/bash
# The GPU-trigger latency runs reported in docs/benchmarks.md (needs a CUDA GPU and NVRTC).
# Usage: scripts/bench-gpu.sh [BIN_DIR]  (the directory of the built examples)
set -euo pipefail
bin=${1:-target/release}
out=$(mktemp)
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader 2>/dev/null | sed 's/^/# /' || true
for trig in host stream kernel; do
  for raw in "" "--raw"; do
    "$bin/pingpong" --trigger $trig $raw --sizes 8,4096 --iters ${ITERS:-5000} --json | tee -a "$out"
  done
done
for trig in stream kernel; do
  "$bin/pingpong" --trigger $trig --op write-imm --sizes 8 --iters ${ITERS:-5000} --json | tee -a "$out"
  "$bin/pingpong" --trigger $trig --mem device --sizes 8,4096 --iters ${ITERS:-2000} --json | tee -a "$out"
done
python3 - "$out" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.startswith("{")]
raw = {(r["trigger"], r["mem"], r["bytes"]): r["t_p50_us"] for r in rows if r["raw"]}
print("\nhalf round trip, p50 [us]; ratio to the same trigger's --raw (host memory)")
print(f"{'trigger':8} {'op':10} {'mem':7} {'bytes':>6} {'p50':>8} {'p99':>8} {'avg':>8} {'raw p50':>8} {'ratio':>6} {'cpu/iter':>9}")
for r in rows:
    if r["raw"]: continue
    fl = raw.get((r["trigger"], "host", r["bytes"]))
    ratio = f"{r['t_p50_us']/fl:6.2f}" if fl else "     -"
    fls = f"{fl:8.3f}" if fl else "       -"
    print(f"{r['trigger']:8} {r['op']:10} {r['mem']:7} {r['bytes']:>6} {r['t_p50_us']:8.3f} {r['t_p99_us']:8.3f} {r['t_avg_us']:8.3f} {fls} {ratio} {r['cpu_us_per_iter']:9.3f}")
h = {(r["op"], r["bytes"]): r["t_p50_us"] for r in rows if r["trigger"] == "host" and not r["raw"] and r["mem"] == "host"}
for r in rows:
    if r["trigger"] == "stream" and not r["raw"] and r["mem"] == "host" and (r["op"], r["bytes"]) in h:
        print(f"stream vs host, {r['op']} {r['bytes']} B: {100*(1-r['t_p50_us']/h[(r['op'], r['bytes'])]):.0f}% lower")
PY
rm -f "$out"
