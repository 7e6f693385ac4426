#!/bin/bash
# Where a GPU trigger's time goes (docs/benchmarks.md): what each rank runs per iteration
# (pingpong --explain), what those lists and kernel steps cost the GPU (memop_cost), and the
# measured half round trips of the same loops, each trigger and op next to its --raw floor,
# with and without "rung to" (--ringers), and the floor with a CPU thread carrying each marker
# (--raw --relay, the least a NIC made of CPU threads adds). Needs a CUDA GPU and NVRTC.
# Usage: scripts/floor-accounting.sh [BIN_DIR]  (the directory of the built examples)
set -euo pipefail
bin=${1:-target/release}
iters=${ITERS:-5000}
out=$(mktemp)
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader 2>/dev/null | sed 's/^/# /' || true
echo "## per-iteration operations (pingpong --explain --size 8)"
"$bin/pingpong" --explain --size 8 | tee "$out.explain"
"$bin/pingpong" --explain --size 8 --trigger stream --ringers mixed | tee -a "$out.explain"
"$bin/pingpong" --explain --size 8 --trigger kernel --ringers mixed | grep -v '^    ' || true
echo
echo "## what the stream lists cost the GPU (memop_cost --shape, every shape printed above)"
mapfile -t shapes < <(sed -n 's/^    shape: //p' "$out.explain" | sort -u)
args=()
for s in "${shapes[@]}"; do args+=(--shape "$s"); done
"$bin/memop_cost" "${args[@]}"
echo
echo "## stream memory operations and kernel steps (memop_cost)"
"$bin/memop_cost"
echo
echo "## measured: half round trip p50 [us], 8 B, host memory"
run() { # label, pingpong flags
  local label=$1; shift
  local p50
  p50=$("$bin/pingpong" "$@" --size 8 --iters "$iters" --json | python3 -c 'import json,sys; print([json.loads(l) for l in sys.stdin if l.startswith("{")][-1]["t_p50_us"])')
  printf '%-44s %8.3f\n' "$label" "$p50"
}
for rep in 1 2 3; do
  echo "# repetition $rep"
  run "host --raw" --trigger host --raw
  run "host write" --trigger host
  for trig in stream kernel; do
    run "$trig --raw" --trigger $trig --raw
    run "$trig --raw --relay (CPU threads carry)" --trigger $trig --raw --relay
    for op in write write-imm send; do
      run "$trig $op (ringers executors)" --trigger $trig --op $op
    done
    run "$trig write --ringers mixed" --trigger $trig --ringers mixed
  done
done
rm -f "$out" "$out.explain"
