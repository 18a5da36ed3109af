#!/usr/bin/env bash
# Runs a provider conformance script (the official SDK against our fake).
# Usage: run.sh e2b|daytona BUILD_DIR
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
which=$1
build=$(cd "$2" && pwd)
dir="$root/tests/conformance/$which"
[ -d "$dir/node_modules" ] || { echo "missing $dir/node_modules: run scripts/install-deps.sh"; exit 1; }
node_bin=$(bash "$root/scripts/node-for-sdks.sh")
exec "$node_bin" "$dir/conformance.js" "$build/fake-$which"
