#!/bin/bash
# Runs verbs programs not written here as unmodified programs on the emulated HCA: Debian's
# perftest clients (package perftest) and rdma-core's ibv_rc_pingpong (ibverbs-utils). For
# each test, size and iteration count, a server and a client, each a process under its own
# emulator (scripts/with-emulated-hca), reaching each other through the emulators' fabric.
#   scripts/perftest-under-emulator.sh [--iters N] [--sizes "8 4096"] [--tests "ib_write_lat ..."]
#                                      [--pingpongs "8:50 4096:20"] [--all-iters N]
# Tests: the eight perftest latency and bandwidth clients; `ibv_rc_pingpong` (with -c: each
# side checks every buffer it receives), once per SIZE:ITERS of --pingpongs; `ib_write_bw-a`
# (ib_write_bw -a: every size from 2 B to 8 MiB, --all-iters iterations each).
# Every run is bounded by `timeout` (PERFTEST_TIMEOUT seconds, default 30): a hang fails that
# run with a clear message instead of stalling. Prints one line per run (latency: typical µs;
# bandwidth: average MB/s; pingpong: µs per iteration) and exits non-zero when any run failed.
# PERFTEST_EXTRA adds flags to every perftest run on both sides (e.g. "--use_cuda=0").
set -uo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
iters=100
sizes="8 4096"
pingpongs="8:50 4096:20 65536:5"
all_iters=5
tests="ibv_rc_pingpong ib_write_lat ib_read_lat ib_send_lat ib_atomic_lat ib_write_bw ib_read_bw ib_send_bw ib_atomic_bw ib_write_bw-a"
while [ $# -gt 0 ]; do
  case "$1" in
    --iters) iters=$2; shift 2 ;;
    --sizes) sizes=$2; shift 2 ;;
    --tests) tests=$2; shift 2 ;;
    --pingpongs) pingpongs=$2; shift 2 ;;
    --all-iters) all_iters=$2; shift 2 ;;
    *) echo "usage: $0 [--iters N] [--sizes \"8 4096\"] [--tests \"ib_write_lat ...\"] [--pingpongs \"8:50 ...\"] [--all-iters N]" >&2; exit 2 ;;
  esac
done
limit=${PERFTEST_TIMEOUT:-30}
for t in $tests; do
  t=${t%-a}
  command -v "$t" >/dev/null || { echo "$t: not installed (apt-get install perftest ibverbs-utils)" >&2; exit 2; }
done
# Build once (the emulator and the soft HCA every process gets), then run the binary directly.
# UVEMU_EMULATOR=path/to/with-emulated-hca uses a prebuilt one instead (a machine without cargo;
# the soft HCA library beside it, UVEMU_PRELOAD naming the preload library).
if [ -n "${UVEMU_EMULATOR:-}" ]; then
  emu=$UVEMU_EMULATOR
else
  "$root/scripts/with-emulated-hca" true || exit 2
  target=$(cd "$root" && cargo metadata --format-version 1 --no-deps \
    | python3 -c 'import json, sys; print(json.load(sys.stdin)["target_directory"])')
  emu="$target/release/with-emulated-hca"
fi
logs=$(mktemp -d "${TMPDIR:-/tmp}/perftest-emu.XXXXXX")
port=$((20000 + $$ % 20000))
failed=0

# listening PORT: waits until a server listens there.
source "$(dirname "$0")/lib/listening.sh"

# The figure the run printed: latency tests' t_typical, bandwidth tests' BW average (of the
# largest size, for -a), ibv_rc_pingpong's time per iteration.
figure() {
  case "$2" in
    pingpong) awk '/usec\/iter/ { v = $(NF - 1) " us/iter" } END { print v }' "$1" ;;
    *) awk -v lat="$([ "$2" = lat ] && echo 1 || echo 0)" \
      '$1 ~ /^[0-9]+$/ && NF >= 4 { v = lat ? $5 " us typical" : $4 " MB/s average" } END { print v }' "$1" ;;
  esac
}

run_pair() { # test size [iterations]
  local t=$1 s=$2 n=${3:-$iters} kind=bw
  local args=(-n "$n" -p "$port") name="$1 -s $2"
  case "$t" in
    *atomic*) name=$t ;;
    ibv_rc_pingpong) args+=(-s "$s" -g 0 -c); name="$t -c -s $s -n $n"; kind=pingpong ;;
    ib_write_bw-a) t=ib_write_bw; args=(-a -n "$n" -p "$port"); name="ib_write_bw -a -n $n" ;;
    *) args+=(-s "$s") ;;
  esac
  case "$t" in *_lat) kind=lat ;; esac
  # shellcheck disable=SC2206 # PERFTEST_EXTRA is a list of flags
  [ "$t" = ibv_rc_pingpong ] || args+=(${PERFTEST_EXTRA:-})
  local slog="$logs/$1-$s-$n.server" clog="$logs/$1-$s-$n.client" start=$SECONDS
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
  if [ $crc -eq 0 ] && [ $src -eq 0 ]; then
    printf 'ok   %-32s %-22s %3d s\n' "$name" "$(figure "$clog" $kind)" $((SECONDS - start))
    return
  fi
  failed=1
  for rc in $crc $src; do
    [ "$rc" -eq 124 ] && echo "FAIL $name: hung, killed after ${limit}s (PERFTEST_TIMEOUT)"
  done
  echo "FAIL $name: client exit $crc, server exit $src; client output:"; tail -15 "$clog"
  echo "server output:"; tail -15 "$slog"
}

echo "verbs programs under the emulated HCA: $iters iterations; logs in $logs"
for t in $tests; do
  case "$t" in
    *atomic*) run_pair "$t" 8 ;;
    ibv_rc_pingpong) for p in $pingpongs; do run_pair "$t" "${p%%:*}" "${p##*:}"; done ;;
    ib_write_bw-a) run_pair "$t" all "$all_iters" ;;
    *) for s in $sizes; do run_pair "$t" "$s"; done ;;
  esac
done
[ $failed -eq 0 ] && rm -rf "$logs"
exit $failed
