#!/bin/bash
# stencil2d on the GPU: time per iteration of the host-driven, stream-triggered and
# persistent-kernel halo exchange, halos in device or pinned host memory, for square
# subdomains of 64² … 4096² per rank and 2 and 4 ranks (threads of one process, soft device;
# ranks round robin over the machine's GPUs). Writes one JSON line per run to OUT and prints
# a summary: medians over the repetitions, with the range, and each GPU trigger's gain over
# host-driven.
# Usage: scripts/bench-stencil.sh [BIN_DIR] [OUT]          the sweep, one build
#        scripts/bench-stencil.sh BEFORE_DIR AFTER_DIR [REPS]  two builds side by side:
#          alternating run for run, REPS repetitions (default 3), 64² and 256² (SUBS), rows
#          tagged "build":"before"/"after" in OUT (default stencil-ab.jsonl)
#   SUBS="64 256"      subdomain sizes (default 64 128 256 512 1024 2048 4096; 64 256 for two builds)
#   RANKS="4"          rank counts (default 2 4)
#   REPS=3             repetitions, alternating (default 1 for the sweep)
#   EXTRA="--gpus 0"   more stencil2d flags for every run (e.g. --shared-device)
#   BASELINE=DIR       the sweep form, plus the stencil2d in DIR alternating with BIN_DIR
#                      (rows tagged "build":"baseline" or "build":"new")
#   with binaries built elsewhere: bash scripts/bench-stencil.sh path/to/examples
# Takes about 5 minutes per repetition and build (each run compiles its kernels with NVRTC).
set -euo pipefail
if [ $# -ge 2 ] && [ -d "$2" ]; then
  builds="before=$1 after=$2"
  REPS=${3:-3}
  SUBS=${SUBS:-64 256}
  out=${OUT:-stencil-ab.jsonl}
else
  bin=${1:-target/release}
  out=${2:-stencil-gpu.jsonl}
  builds="new=$bin"
  [ -n "${BASELINE:-}" ] && builds="baseline=$BASELINE $builds"
fi
for b in $builds; do
  [ -x "${b#*=}/stencil2d" ] || { echo "no stencil2d in ${b#*=}" >&2; exit 2; }
done
: > "$out"
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader 2>/dev/null | sed 's/^/# /' || true
# Iterations per subdomain size: about a second of timed work each, at least 50.
iters_for() {
  case $1 in
    64|128) echo 2000 ;; 256) echo 1000 ;; 512) echo 500 ;; 1024) echo 200 ;;
    2048) echo 100 ;; *) echo 50 ;;
  esac
}
for rep in $(seq "${REPS:-1}"); do
  for ranks in ${RANKS:-2 4}; do
    for sub in ${SUBS:-64 128 256 512 1024 2048 4096}; do
      iters=$(iters_for $sub)
      for halo in host device; do
        for trig in host stream kernel; do
          for b in $builds; do
            tag=${b%%=*} dir=${b#*=}
            # shellcheck disable=SC2086
            line=$(timeout 120 "$dir/stencil2d" --trigger $trig --halo $halo --ranks $ranks \
              --sub $sub --iters $iters --warmup $((iters / 10)) --json ${EXTRA:-} \
              | grep '^{' | sed "s/^{/{\"build\":\"$tag\",\"rep\":$rep,/") \
              || line="# FAILED ($tag): --trigger $trig --halo $halo --ranks $ranks --sub $sub"
            echo "$line" | tee -a "$out"
          done
        done
      done
    done
  done
done
python3 - "$out" <<'PY'
import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.startswith("{")]
t = {}
for r in rows:
    k = (r.get("build", "new"), r["ranks"], r["subdomain"], r["halo"], r["trigger"])
    t.setdefault(k, []).append(r["us_per_iter"])
med = {k: statistics.median(v) for k, v in t.items()}
rng = lambda k: f"{min(t[k]):.2f}-{max(t[k]):.2f}" if k in t and len(t[k]) > 1 else ""
print("\ntime per iteration [us] (total / iters), median over repetitions (range);")
print("gain = how much faster than host-driven, from the medians")
print(f"{'build':>8} {'ranks':>5} {'subdomain':>10} {'halo':>6} {'host':>18} {'stream':>18} {'kernel':>18} {'stream gain':>12} {'kernel gain':>12}")
fmt = lambda k: f"{med[k]:7.2f} {rng(k):>10}" if k in med else f"{'-':>18}"
gain = lambda h, x: f"{100 * (1 - med[x] / med[h]):11.1f}%" if h in med and x in med else f"{'-':>12}"
order = {"before": 0, "baseline": 0, "after": 1, "new": 1}
cells = sorted({k[:4] for k in t}, key=lambda k: (k[1], int(k[2].split('x')[0]), k[3], order.get(k[0], 2)))
for c in cells:
    h, s, k = ((*c, x) for x in ("host", "stream", "kernel"))
    print(f"{c[0]:>8} {c[1]:>5} {c[2]:>10} {c[3]:>6} {fmt(h)} {fmt(s)} {fmt(k)} {gain(h, s)} {gain(h, k)}")
PY
python3 - "$out" <<'PY'
import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.startswith("{")]
builds = sorted({r.get("build", "new") for r in rows})
pairs = [("before", "after"), ("baseline", "new")]
pair = next((p for p in pairs if set(p) <= set(builds)), None)
if pair:
    t = {}
    for r in rows:
        k = (r.get("build", "new"), r["ranks"], r["subdomain"], r["halo"], r["trigger"])
        t.setdefault(k, []).append(r["us_per_iter"])
    print(f"\n{pair[1]} against {pair[0]}: medians [us], change (negative: faster)")
    print(f"{'ranks':>5} {'subdomain':>10} {'halo':>6} {'trigger':>7} {pair[0]:>9} {pair[1]:>9} {'change':>8}")
    for k in sorted({k[1:] for k in t if k[0] == pair[0]}, key=lambda k: (k[0], int(k[1].split('x')[0]), k[2], k[3])):
        a, b = t.get((pair[0], *k)), t.get((pair[1], *k))
        if a and b:
            ma, mb = statistics.median(a), statistics.median(b)
            print(f"{k[0]:>5} {k[1]:>10} {k[2]:>6} {k[3]:>7} {ma:9.2f} {mb:9.2f} {100 * (mb / ma - 1):7.1f}%")
PY
