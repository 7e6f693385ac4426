#!/bin/bash
# The messaging layer's overhead per trigger (pingpong --api mp next to --api gdsync, both
# --op send, alternating, two repetitions; the kernel trigger is mp's kernel channels against
# gdsync's descriptor-ring kernel, both timed by the GPU's clock) and the Open MPI baseline
# (host buffers, and device buffers staged through pinned host memory), as reported in
# docs/benchmarks.md.
# Usage, from the repository root: scripts/bench-mp.sh [BIN_DIR]   (target/release, or
# binaries built elsewhere; GPU triggers are skipped without a GPU, MPI without mpicc)
set -euo pipefail
bin=${1:-target/release}
out=$(mktemp)
it=${ITERS:-10000}
trigs="cpu"
nvidia-smi -L >/dev/null 2>&1 && trigs="cpu host stream kernel"
for rep in $(seq 1 ${REPS:-2}); do
  for trig in $trigs; do
    mems="host"; [ "$trig" != cpu ] && mems="host device"
    for mem in $mems; do
      for api in gdsync mp; do
        timeout ${RUN_TIMEOUT:-120} "$bin/pingpong" --api $api --op send --trigger $trig \
          --mem $mem --sizes 8,4096 --iters "$it" --json \
          | sed "s/^{/{\"rep\":$rep,\"api\":\"$api\",/" | tee -a "$out" \
          || echo "FAILED: pingpong --api $api --trigger $trig --mem $mem" >&2
      done
    done
  done
done
if command -v mpicc >/dev/null && command -v mpirun >/dev/null; then
  mpicc -O2 -o /tmp/mpi_pingpong benches/mpi_pingpong.c -ldl
  mems="host"; nvidia-smi -L >/dev/null 2>&1 && mems="host device"
  for mem in $mems; do
    timeout ${RUN_TIMEOUT:-120} mpirun --allow-run-as-root --oversubscribe -np 2 \
      /tmp/mpi_pingpong --mem $mem --sizes 8,4096 --iters "$it" --json | tee -a "$out" \
      || echo "FAILED: mpi_pingpong --mem $mem" >&2
  done
fi
python3 - "$out" <<'PY'
import json, sys, statistics
rows = [json.loads(l) for l in open(sys.argv[1]) if l.startswith("{")]
mpi = {(r["mem"], r["bytes"]): r["t_p50_us"] for r in rows if r.get("impl") == "openmpi"}
keys = sorted({(r["trigger"], r["mem"], r["bytes"]) for r in rows if "api" in r},
              key=lambda k: (["cpu", "host", "stream", "kernel"].index(k[0]), k[1], k[2]))
print("\nhalf round trip p50 [us], --op send; per repetition gdsync / mp; overhead = mp/gdsync - 1 (median of reps)")
print(f"{'trigger':8} {'mem':7} {'bytes':>6} {'gdsync p50':>16} {'mp p50':>16} {'overhead':>9} {'Open MPI':>9}")
for t, m, b in keys:
    g = [r["t_p50_us"] for r in rows if r.get("api") == "gdsync" and (r["trigger"], r["mem"], r["bytes"]) == (t, m, b)]
    p = [r["t_p50_us"] for r in rows if r.get("api") == "mp" and (r["trigger"], r["mem"], r["bytes"]) == (t, m, b)]
    ov = statistics.median([y / x - 1 for x, y in zip(g, p)]) * 100 if g and p else float("nan")
    o = mpi.get((m, b))
    print(f"{t:8} {m:7} {b:>6} {' / '.join(f'{x:.3f}' for x in g):>16} {' / '.join(f'{x:.3f}' for x in p):>16} {ov:+8.0f}% {o if o is not None else '-':>9}")
PY
