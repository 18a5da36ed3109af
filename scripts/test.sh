#!/usr/bin/env bash
# The whole test suite: installs what is missing, builds, runs every test.
#
# Every target is built once, with AddressSanitizer + UndefinedBehaviorSanitizer
# (build-asan/, gcc -O1), and every ctest entry runs against that build: the
# gtest cases, the corpus replays, the short soaks, and the programs that
# judge the daemon from outside (language clients, MCP judges, provider SDKs,
# deploy checks, the benchmark's smoke run). A leak, a bad access or any
# undefined behaviour fails the suite.
#
#   scripts/test.sh [ctest args...]        the whole suite, instrumented (above)
#   scripts/test.sh --plain [ctest args]   the same suite on the -O2 build in build/
#   scripts/test.sh --sanitize=thread      the TSan suite (build-tsan/)
set -euo pipefail
cd "$(dirname "$0")/.."
mode=address
case "${1:-}" in
  --plain) mode=plain; shift ;;
  --sanitize=*) mode="${1#--sanitize=}"; shift ;;
esac
bash scripts/install-deps.sh
if [ "$mode" = plain ]; then
  bash scripts/build.sh
  cd build
  exec ctest --output-on-failure --timeout 600 "$@"
fi
exec bash scripts/sanitize-test.sh "$mode" "$@"
