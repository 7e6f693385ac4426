# Sourced by the scripts that run perftest pairs (perftest-under-emulator.sh,
# bench-verbs-latency.sh): listening PORT waits (up to 10 s) until a process listens on TCP port
# PORT, read from /proc (a probe connection would take the server's one connection).
listening() {
  local hex
  hex=$(printf ':%04X ' "$1")
  for _ in $(seq 100); do
    grep -q "$hex.* 0A " /proc/net/tcp /proc/net/tcp6 2>/dev/null && return 0
    sleep 0.1
  done
  return 1
}
