#!/bin/bash
# stencil2d on the GPU: time per iteration of the host-driven, stream-triggered and
# persistent-kernel halo exchange, halos in device or pinned host memory, for square
# subdomains of 64² … 4096² per rank and 2 and 4 ranks (threads of one process, one GPU, soft
# device). Writes one JSON line per run to OUT and prints a summary.
# Usage: scripts/bench-stencil.sh [BIN_DIR] [OUT]   (SUBS="64 256" to pick sizes)
#   with binaries built elsewhere: bash scripts/bench-stencil.sh path/to/examples
# Takes about 5 minutes (each run compiles its kernels with NVRTC first).
set -euo pipefail
bin=${1:-target/release}
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
  for sub in ${SUBS:-64 128 256 512 1024 2048 4096}; do
    iters=$(iters_for $sub)
    for halo in host device; do
      for trig in host stream kernel; do
        timeout 120 "$bin/stencil2d" --trigger $trig --halo $halo --ranks $ranks --sub $sub \
          --iters $iters --warmup $((iters / 10)) --json | tee -a "$out" \
          || echo "# FAILED: --trigger $trig --halo $halo --ranks $ranks --sub $sub" | tee -a "$out"
      done
    done
  done
done
python3 - "$out" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.startswith("{")]
t = {(r["ranks"], r["subdomain"], r["halo"], r["trigger"]): r["us_per_iter"] for r in rows}
print("\ntime per iteration [us] (total / iters); gain = how much faster than host-driven")
print(f"{'ranks':>5} {'subdomain':>10} {'halo':>6} {'host':>9} {'stream':>9} {'kernel':>9} {'stream gain':>12} {'kernel gain':>12}")
fmt = lambda x: f"{x:9.2f}" if x else f"{'-':>9}"
gain = lambda h, x: f"{100 * (1 - x / h):11.1f}%" if h and x else f"{'-':>12}"
for (ranks, sub, halo) in sorted({k[:3] for k in t}, key=lambda k: (k[0], int(k[1].split('x')[0]), k[2])):
    h, s, k = (t.get((ranks, sub, halo, x)) for x in ("host", "stream", "kernel"))
    print(f"{ranks:>5} {sub:>10} {halo:>6} {fmt(h)} {fmt(s)} {fmt(k)} {gain(h, s)} {gain(h, k)}")
PY
