#!/bin/bash
# Latency of unmodified verbs programs (Debian's perftest) on the emulated HCA, before and after
# a change, side by side: each repetition runs every test once with each soft HCA library,
# alternating, and the table gives the medians of perftest's typical latency.
#   scripts/bench-verbs-latency.sh --before OLD.so [--after NEW.so] [--reps 5] [--iters 2000]
#                                  [--tests "ib_write_lat ib_send_lat"] [--sizes "8"] [--load N]
#                                  [--pin spread|same]
# OLD.so/NEW.so: libgdasync_emulated_hca.so of the two builds (copy the first aside before
# rebuilding; --after defaults to this tree's, built here). --load N runs N busy loops
# (`yes >/dev/null`) for the whole run. --pin places the two programs with taskset: the server on
# the first allowed core and the client on the second (spread), or both on the first (same);
# by default the scheduler places them. A run that fails (perftest's "transport retry counter
# exceeded", a hang past PERFTEST_TIMEOUT seconds, default 60) counts in the table's "failed".
set -uo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
before="" after="" reps=5 iters=2000 load=0 sizes="8" pin=""
tests="ib_write_lat ib_send_lat"
while [ $# -gt 0 ]; do
  case "$1" in
    --before) before=$2; shift 2 ;;
    --after) after=$2; shift 2 ;;
    --reps) reps=$2; shift 2 ;;
    --iters) iters=$2; shift 2 ;;
    --tests) tests=$2; shift 2 ;;
    --sizes) sizes=$2; shift 2 ;;
    --load) load=$2; shift 2 ;;
    --pin) pin=$2; shift 2 ;;
    *) sed -n '2,13p' "$0" >&2; exit 2 ;;
  esac
done
server_pin=() client_pin=()
if [ -n "$pin" ]; then
  cores=($(python3 -c 'import os; print(*sorted(os.sched_getaffinity(0)))'))
  case "$pin" in
    spread) [ ${#cores[@]} -ge 2 ] || { echo "--pin spread needs two cores" >&2; exit 2; }
            server_pin=(taskset -c "${cores[0]}") client_pin=(taskset -c "${cores[1]}") ;;
    same) server_pin=(taskset -c "${cores[0]}") client_pin=(taskset -c "${cores[0]}") ;;
    *) echo "--pin: spread or same, not '$pin'" >&2; exit 2 ;;
  esac
fi
[ -n "$before" ] && [ -f "$before" ] || { echo "--before: give the earlier build's libgdasync_emulated_hca.so" >&2; exit 2; }
"$root/scripts/with-emulated-hca" true || exit 2
target=$(cd "$root" && cargo metadata --format-version 1 --no-deps \
  | python3 -c 'import json, sys; print(json.load(sys.stdin)["target_directory"])')
emu="$target/release/with-emulated-hca"
[ -n "$after" ] || after="$target/release/libgdasync_emulated_hca.so"
limit=${PERFTEST_TIMEOUT:-60}
logs=$(mktemp -d "${TMPDIR:-/tmp}/bench-verbs.XXXXXX")
port=$((20000 + $$ % 20000))
loaders=()
cleanup() { for p in "${loaders[@]}"; do kill "$p" 2>/dev/null; done; }
trap cleanup EXIT
for _ in $(seq "$load"); do yes >/dev/null & loaders+=($!); done

# listening PORT: waits until a server listens there.
source "$(dirname "$0")/lib/listening.sh"

# One server+client pair with soft HCA library $1: prints perftest's typical µs, or FAIL.
run_pair() { # lib test size
  local lib=$1 t=$2 s=$3 log="$logs/$2-$3-$port"
  UVEMU_HCA=$lib "${server_pin[@]}" timeout "$limit" "$emu" "$t" -s "$s" -n "$iters" -p "$port" >"$log.server" 2>&1 &
  local server=$!
  if ! listening "$port"; then kill "$server" 2>/dev/null; wait "$server"; echo FAIL; return; fi
  UVEMU_HCA=$lib "${client_pin[@]}" timeout "$limit" "$emu" "$t" -s "$s" -n "$iters" -p "$port" 127.0.0.1 >"$log.client" 2>&1
  local crc=$?
  wait "$server"
  local src=$?
  port=$((port + 1))
  if [ $crc -ne 0 ] || [ $src -ne 0 ]; then echo FAIL; return; fi
  awk '$1 ~ /^[0-9]+$/ && NF >= 5 { v = $5 } END { print v }' "$log.client"
}

echo "verbs latency on the emulated HCA: $iters iterations, $reps repetitions, load $load extra busy loops, ${pin:-unpinned}; $(nproc) cores, load average $(cut -d' ' -f1-3 /proc/loadavg)"
echo "before: $before"
echo "after:  $after"
results="$logs/results"
for r in $(seq "$reps"); do
  for t in $tests; do
    for s in $sizes; do
      for which in before after; do
        lib=$before; [ $which = after ] && lib=$after
        v=$(run_pair "$lib" "$t" "$s")
        printf '%s -s %s\t%s\t%s\n' "$t" "$s" "$which" "$v" >>"$results"
        printf 'rep %d  %-12s -s %-5s %-6s %s\n' "$r" "$t" "$s" "$which" "$v"
      done
    done
  done
done
echo "load average at the end: $(cut -d' ' -f1-3 /proc/loadavg)"
python3 "$root/scripts/median-table.py" "$results" "µs"
rm -rf "$logs"
