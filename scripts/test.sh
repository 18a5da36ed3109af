#!/usr/bin/env bash
# The whole test suite: installs what is missing, builds, runs every test.
set -euo pipefail
cd "$(dirname "$0")/.."
# --sanitize=address|thread: the sanitizer suite instead (build-asan/ or
# build-tsan/; see scripts/sanitize-test.sh).
if [[ "${1:-}" == --sanitize=* ]]; then
  kind="${1#--sanitize=}"
  shift
  exec bash scripts/sanitize-test.sh "$kind" "$@"
fi
bash scripts/install-deps.sh
bash scripts/build.sh
cd build
ctest --output-on-failure --timeout 600
