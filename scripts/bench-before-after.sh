#!/bin/bash
# Two builds side by side: pingpong with the CPU, stream and kernel triggers (host memory, 8 B
# and 4 KiB) and bandwidth at 64 KiB (one-second runs), alternating between the builds, REPS
# times, on the whole machine. Prints JSON lines to a temporary file, then one median table.
# Usage: scripts/bench-before-after.sh BEFORE_DIR AFTER_DIR [REPS]
#   (each directory holds the pingpong and bandwidth binaries of one build). A build whose
#   pingpong knows --shared-device runs with it, so both measure one device serving both ranks.
set -euo pipefail
before=${1:?usage: scripts/bench-before-after.sh BEFORE_DIR AFTER_DIR [REPS]}
after=${2:?usage: scripts/bench-before-after.sh BEFORE_DIR AFTER_DIR [REPS]}
reps=${3:-5}
out=$(mktemp)
echo "# $(nproc) cores: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs)"
run() { # label binary args...
  local label=$1; shift
  "$@" --json 2>/dev/null | sed "s|^{|{\"label\":\"$label\",|" >> "$out"
}
for rep in $(seq "$reps"); do
  for side in before after; do
    dir=$before; [ "$side" = after ] && dir=$after
    shared=""; "$dir/pingpong" --help | grep -q -- --shared-device && shared=--shared-device
    run "$side cpu" "$dir/pingpong" --trigger cpu $shared --sizes 8,4096 --iters 20000
    run "$side stream" "$dir/pingpong" --trigger stream --mem host --sizes 8,4096 --iters 5000
    run "$side kernel" "$dir/pingpong" --trigger kernel --mem host --sizes 8,4096 --iters 5000
    run "$side bw" "$dir/bandwidth" --sizes 65536 --duration 1
  done
done
python3 - "$out" <<'PY'
import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.startswith("{")]
def med(label, size, key):
    v = [r[key] for r in rows if r["label"] == label and r["bytes"] == size and key in r]
    return statistics.median(v) if v else float("nan")
print(f"{'what':18} {'bytes':>6} {'before':>9} {'after':>9} {'after/before':>13}")
for what in ("cpu", "stream", "kernel"):
    for s in (8, 4096):
        b, a = med("before " + what, s, "t_p50_us"), med("after " + what, s, "t_p50_us")
        print(f"{what + ' p50 [us]':18} {s:>6} {b:9.3f} {a:9.3f} {a / b:13.3f}")
b, a = med("before bw", 65536, "gbytes_per_s"), med("after bw", 65536, "gbytes_per_s")
print(f"{'bandwidth [GB/s]':18} {65536:>6} {b:9.3f} {a:9.3f} {a / b:13.3f}")
PY
rm -f "$out"
