#!/bin/bash
# gdasync's own pingpong, two builds side by side, on the soft device and on the emulated mlx5
# device (threads and --ranks-as procs each; 8 B and 4 KiB, 20000 iterations), alternating
# between the builds REPS times; prints the medians of the half round trip's p50.
#   scripts/bench-pingpong-progress.sh BEFORE_DIR AFTER_DIR [REPS]
# Each directory holds one build's pingpong binary (copy the first aside before rebuilding).
set -euo pipefail
before=${1:?usage: scripts/bench-pingpong-progress.sh BEFORE_DIR AFTER_DIR [REPS]}
after=${2:?usage: scripts/bench-pingpong-progress.sh BEFORE_DIR AFTER_DIR [REPS]}
reps=${3:-5}
root=$(cd "$(dirname "$0")/.." && pwd)
"$root/scripts/with-emulated-hca" true
target=$(cd "$root" && cargo metadata --format-version 1 --no-deps \
  | python3 -c 'import json, sys; print(json.load(sys.stdin)["target_directory"])')
emu="$target/release/with-emulated-hca"
out=$(mktemp)
echo "# $(nproc) cores, load average $(cut -d' ' -f1-3 /proc/loadavg)"
for _ in $(seq "$reps"); do
  for side in before after; do
    dir=$before; [ "$side" = after ] && dir=$after
    for cfg in "soft threads|" "soft procs|--ranks-as procs" "mlx5 threads|-d mlx5_0" \
      "mlx5 procs|-d mlx5_0 --ranks-as procs"; do
      label=${cfg%%|*}; pre=()
      read -r -a args <<<"${cfg#*|}"
      case $label in mlx5*) pre=("$emu") ;; esac
      timeout 120 "${pre[@]}" "$dir/pingpong" "${args[@]}" --sizes 8,4096 --iters 20000 --json 2>/dev/null \
        | python3 -c 'import json, sys
for l in sys.stdin:
    if l.startswith("{"):
        r = json.loads(l)
        print("%s %s B\t%s\t%s" % (sys.argv[1], r["bytes"], sys.argv[2], r["t_p50_us"]))' "$label" "$side" >>"$out" || true
    done
  done
done
echo "# load average at the end $(cut -d' ' -f1-3 /proc/loadavg)"
python3 "$root/scripts/median-table.py" "$out" "p50 µs"
rm -f "$out"
