#!/bin/bash
# stencil2d on the GPU: time per iteration of the host-driven and stream-triggered halo
# exchange, for square subdomains of 64² … 4096² per rank and 2 and 4 ranks (threads of one
# process, one GPU, soft device). Writes one JSON line per run to OUT and prints a summary.
# Usage: scripts/bench-stencil.sh [BIN_DIR] [OUT]
#   on the GPU machine, after device-pack: bash scripts/bench-stencil.sh .device/bin
# Takes about 2-3 minutes (each run compiles its kernels with NVRTC first).
set -euo pipefail
bin=${1:-target/release/examples}
out=${2:-stencil-gpu.jsonl}
: > "$out"
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader 2>/dev/null | sed 's/^/# /' || true
# Iterations per subdomain size: about a second of timed work each, at least 50.
iters_for() {
  case $1 in
    64|128) echo 2000 ;; 256) echo 1000 ;; 512) echo 500 ;; 1024) echo 200 ;;
    2048) echo 100 ;; *) echo 50 ;;
  esac
}
for ranks in 2 4; do
  for sub in 64 128 256 512 1024 2048 4096; do
    iters=$(iters_for $sub)
    for trig in host stream; do
      timeout 120 "$bin/stencil2d" --trigger $trig --ranks $ranks --sub $sub \
        --iters $iters --warmup $((iters / 10)) --json | tee -a "$out" \
        || echo "# FAILED: --trigger $trig --ranks $ranks --sub $sub" | tee -a "$out"
    done
  done
done
python3 - "$out" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.startswith("{")]
t = {(r["ranks"], r["subdomain"], r["trigger"]): r["us_per_iter"] for r in rows}
print("\ntime per iteration [us] (total / iters); stream vs host")
print(f"{'ranks':>5} {'subdomain':>10} {'host':>10} {'stream':>10} {'stream faster by':>17}")
for (ranks, sub) in sorted({(k[0], k[1]) for k in t}, key=lambda k: (k[0], int(k[1].split('x')[0]))):
    h, s = t.get((ranks, sub, "host")), t.get((ranks, sub, "stream"))
    gain = f"{100 * (1 - s / h):16.1f}%" if h and s else f"{'-':>17}"
    fmt = lambda x: f"{x:10.2f}" if x else f"{'-':>10}"
    print(f"{ranks:>5} {sub:>10} {fmt(h)} {fmt(s)} {gain}")
PY
