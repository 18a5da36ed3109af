#!/usr/bin/env bash
# CI's hardening steps (README "Hardening"), after the main suite passed:
#   1. ASan+UBSan: broker_tests, the fuzz corpus replays and the short soaks
#   2. TSan: broker_tests, which includes the concurrency core (session
#      table, single-flight, reaper, close races, streaming, cancellation)
#   3. every libFuzzer target for FUZZ_SECONDS (default 30) each
# Each step prints its duration; the whole must stay within 25 minutes on a
# fresh 2-core machine.
set -euo pipefail
cd "$(dirname "$0")/.."
t0=$(date +%s)
step() {
  local name="$1"
  shift
  local s
  s=$(date +%s)
  echo "=== hardening: $name ===" >&2
  "$@"
  echo "=== hardening: $name: passed in $(( $(date +%s) - s )) s ===" >&2
}
step "ASan+UBSan suite" bash scripts/sanitize-test.sh address
step "TSan suite" bash scripts/sanitize-test.sh thread
step "fuzz every target ${FUZZ_SECONDS:-30}s" bash scripts/fuzz.sh all "${FUZZ_SECONDS:-30}"
echo "=== hardening: all steps passed in $(( $(date +%s) - t0 )) s ===" >&2
