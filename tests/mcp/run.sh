#!/usr/bin/env bash
# Runs an MCP judge against a live broker: the official clients or the
# conformance tool. Usage: run.sh clients|conformance BUILD_DIR
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
which=$1
build=$(cd "$2" && pwd)
[ -d "$here/node_modules" ] || { echo "missing $here/node_modules: run scripts/install-deps.sh"; exit 1; }
if [ "$which" = conformance ]; then
  node_bin=$(NODE_MIN_MAJOR=22 bash "$root/scripts/node-for-sdks.sh")
else
  node_bin=$(bash "$root/scripts/node-for-sdks.sh")
fi
exec "$node_bin" "$here/$which.mjs" "$build"
