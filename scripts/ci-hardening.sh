#!/usr/bin/env bash
# CI's hardening steps (docs/hardening.md) beside the README's test command,
# which already runs the whole suite under ASan+UBSan (scripts/test.sh):
#   1. TSan: broker_tests, which includes the concurrency core (session
#      table, single-flight, reaper, close races, streaming, cancellation)
#   2. every libFuzzer target for FUZZ_SECONDS (default 15) each
# Each step prints its duration.
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
step "TSan suite" bash scripts/sanitize-test.sh thread
step "fuzz every target ${FUZZ_SECONDS:-15}s" bash scripts/fuzz.sh all "${FUZZ_SECONDS:-15}"
echo "=== hardening: all steps passed in $(( $(date +%s) - t0 )) s ===" >&2
