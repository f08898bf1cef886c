# shellcheck shell=bash disable=SC2034
# Sourced by deploy/systemd/test-in-container.sh and compose/test.sh: PASS/FAIL lines,
# waits with deadlines (never fixed sleeps), and the summary.
CHECKS_PASSED=0
CHECKS_FAILED=0
FAILED_NAMES=()

pass() { CHECKS_PASSED=$((CHECKS_PASSED + 1)); printf 'PASS: %s\n' "$*"; }
fail() { CHECKS_FAILED=$((CHECKS_FAILED + 1)); FAILED_NAMES+=("$*"); printf 'FAIL: %s\n' "$*"; }
# check NAME CMD...: PASS if CMD succeeds, FAIL (with its output) otherwise.
check() {
  local name=$1 out
  shift
  if out=$("$@" 2>&1); then pass "$name"; else fail "$name"; [ -z "$out" ] || printf '%s\n' "$out" | tail -n 20 | sed 's/^/    /'; fi
}
info() { printf '  .. %s\n' "$*"; }
# check_within NAME SECONDS CMD...: PASS with the time taken if CMD succeeds within
# SECONDS (wait_until), else FAIL with CMD's last answer; returns CMD's verdict, so that
# the caller may add what explains a failure (`check_within ... || journal ...`).
check_within() {
  local name=$1 secs=$2 t=$SECONDS
  shift 2
  if wait_until "$secs" "$@"; then
    pass "$name ($((SECONDS - t)) s)"
  else
    fail "$name"
    "$@" 2>&1 | tail -n 20 | sed 's/^/    /' || true
    return 1
  fi
}

# wait_until SECONDS CMD...: runs CMD every 0.5 s until it succeeds; fails after SECONDS.
wait_until() {
  local deadline=$((SECONDS + $1))
  shift
  until "$@" >/dev/null 2>&1; do
    [ $SECONDS -lt $deadline ] || return 1
    sleep 0.5
  done
}

# stays_same SECONDS EXPECTED CMD...: CMD's output equals EXPECTED at every look for
# SECONDS (a stability window that catches a delayed restart); fails at the first change.
stays_same() {
  local deadline=$((SECONDS + $1)) expected=$2 now
  shift 2
  while :; do
    now=$("$@" 2>&1) || true
    if [ "$now" != "$expected" ]; then
      printf 'changed:\n--- before\n%s\n--- after\n%s\n' "$expected" "$now"
      return 1
    fi
    [ $SECONDS -lt $deadline ] || return 0
    sleep 0.5
  done
}

# A gRPC health check (grpc.health.v1.Health/Check, service "") with curl over a unix
# socket: the request is an empty protobuf in a 5-byte gRPC frame; SERVING answers with the
# frame 00 00000002 0801.
GRPC_HEALTH_SCRIPT='
sock=$1
out=$(printf "\0\0\0\0\0" | curl -s --max-time 3 --http2-prior-knowledge --unix-socket "$sock" \
  -H "content-type: application/grpc" -H "te: trailers" --data-binary @- \
  http://localhost/grpc.health.v1.Health/Check | od -An -tx1 | tr -d " \n")
[ "$out" = 00000000020801 ]'

summary() {
  echo
  printf '%d passed, %d failed\n' "$CHECKS_PASSED" "$CHECKS_FAILED"
  if [ "$CHECKS_FAILED" -gt 0 ]; then
    local n
    for n in "${FAILED_NAMES[@]}"; do printf '  failed: %s\n' "$n"; done
    return 1
  fi
}
