#!/bin/bash
# pingpong latency versus size for every trigger, next to its --raw floor, as JSON lines in OUT
# (the input of `scripts/plot.py latency`). Add Open MPI's staged baseline with
# scripts/bench-mp.sh. Needs a CUDA GPU for the host, stream and kernel triggers.
# Usage: scripts/bench-latency.sh [BIN_DIR] [OUT]   (ITERS per size, default 3000)
set -euo pipefail
bin=${1:-target/release}
out=${2:-latency.jsonl}
: > "$out"
sizes=8,64,512,4096,32768,262144,1048576
triggers=cpu
nvidia-smi -L >/dev/null 2>&1 && triggers="cpu host stream kernel"
for trig in $triggers; do
  for raw in "" "--raw"; do
    timeout "${RUN_TIMEOUT:-120}" "$bin/pingpong" --trigger $trig $raw --sizes $sizes \
      --iters "${ITERS:-3000}" --warmup 200 --json | tee -a "$out" \
      || echo "# FAILED: --trigger $trig $raw" | tee -a "$out"
  done
done
