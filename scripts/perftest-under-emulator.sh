#!/bin/bash
# Runs Debian's perftest clients (package perftest) as unmodified verbs programs on the
# emulated HCA: for each test and size, a server and a client, each a process under its own
# emulator (scripts/with-emulated-hca), reaching each other through the emulators' fabric.
#   scripts/perftest-under-emulator.sh [--iters N] [--sizes "8 4096"] [--tests "ib_write_lat ..."]
# Every run is bounded by `timeout` (PERFTEST_TIMEOUT seconds, default 30): a hang fails that
# run with a clear message instead of stalling. Prints one line per run (latency: typical µs;
# bandwidth: average MB/s) and exits non-zero when any run failed.
set -uo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
iters=100
sizes="8 4096"
tests="ib_write_lat ib_read_lat ib_send_lat ib_atomic_lat ib_write_bw ib_read_bw ib_send_bw ib_atomic_bw"
while [ $# -gt 0 ]; do
  case "$1" in
    --iters) iters=$2; shift 2 ;;
    --sizes) sizes=$2; shift 2 ;;
    --tests) tests=$2; shift 2 ;;
    *) echo "usage: $0 [--iters N] [--sizes \"8 4096\"] [--tests \"ib_write_lat ...\"]" >&2; exit 2 ;;
  esac
done
limit=${PERFTEST_TIMEOUT:-30}
for t in $tests; do
  command -v "$t" >/dev/null || { echo "$t: not installed (apt-get install perftest)" >&2; exit 2; }
done
# Build once (the emulator and the soft HCA every process gets), then run the binary directly.
"$root/scripts/with-emulated-hca" true || exit 2
target=$(cd "$root" && cargo metadata --format-version 1 --no-deps \
  | python3 -c 'import json, sys; print(json.load(sys.stdin)["target_directory"])')
emu="$target/release/with-emulated-hca"
logs=$(mktemp -d "${TMPDIR:-/tmp}/perftest-emu.XXXXXX")
port=$((20000 + $$ % 20000))
failed=0

# Waits (up to 10 s) until a process listens on TCP port $1 (read from /proc: connecting to
# probe would take the server's one connection).
listening() {
  local hex
  hex=$(printf ':%04X ' "$1")
  for _ in $(seq 100); do
    grep -q "$hex.* 0A " /proc/net/tcp /proc/net/tcp6 2>/dev/null && return 0
    sleep 0.1
  done
  return 1
}

# The figure perftest prints for the run: latency tests' t_typical, bandwidth tests' BW average.
figure() {
  awk -v lat="$2" '$1 ~ /^[0-9]+$/ && NF >= 4 { v = lat ? $5 " us typical" : $4 " MB/s average" } END { print v }' "$1"
}

run_pair() { # test size
  local t=$1 s=$2 args=(-n "$iters" -p "$port") name="$1 -s $2"
  case "$t" in *atomic*) name=$t ;; *) args+=(-s "$s") ;; esac
  local slog="$logs/$t-$s.server" clog="$logs/$t-$s.client" start=$SECONDS
  timeout "$limit" "$emu" "$t" "${args[@]}" >"$slog" 2>&1 &
  local server=$!
  if ! listening "$port"; then
    echo "FAIL $name: the server never listened on port $port"; cat "$slog"
    kill "$server" 2>/dev/null; wait "$server"; failed=1; port=$((port + 1)); return
  fi
  timeout "$limit" "$emu" "$t" "${args[@]}" 127.0.0.1 >"$clog" 2>&1
  local crc=$?
  wait "$server"
  local src=$?
  port=$((port + 1))
  local lat=0
  case "$t" in *_lat) lat=1 ;; esac
  if [ $crc -eq 0 ] && [ $src -eq 0 ]; then
    printf 'ok   %-22s %-26s %3d s\n' "$name" "$(figure "$clog" $lat)" $((SECONDS - start))
    return
  fi
  failed=1
  for rc in $crc $src; do
    [ "$rc" -eq 124 ] && echo "FAIL $name: hung, killed after ${limit}s (PERFTEST_TIMEOUT)"
  done
  echo "FAIL $name: client exit $crc, server exit $src; client output:"; tail -15 "$clog"
  echo "server output:"; tail -15 "$slog"
}

echo "perftest under the emulated HCA: $iters iterations; logs in $logs"
for t in $tests; do
  case "$t" in *atomic*) run_pair "$t" 8 ;; *) for s in $sizes; do run_pair "$t" "$s"; done ;; esac
done
[ $failed -eq 0 ] && rm -rf "$logs"
exit $failed
