#!/usr/bin/env bash
# Prints a node binary new enough for the official provider SDKs (e2b needs
# Node >= 20.18.1). The machine's node if it is, else one installed from the
# npm registry's `node` package into .tools/node (by install-deps.sh).
# NODE_MIN_MAJOR=22 asks for Node >= 22 (the MCP conformance tool).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
min_major=${NODE_MIN_MAJOR:-20}
ok() {  # node binary -> exit 0 if >= 20.18.1 and >= $min_major
  "$1" -e 'const [a,b,c]=process.versions.node.split(".").map(Number);
           process.exit(a>='"$min_major"'&&(a>20||(a===20&&(b>18||(b===18&&c>=1))))?0:1)' 2>/dev/null
}
if command -v node >/dev/null 2>&1 && ok "$(command -v node)"; then
  command -v node
  exit 0
fi
local_node="$root/.tools/node/node_modules/node/bin/node"
if [ -x "$local_node" ] && ok "$local_node"; then
  echo "$local_node"
  exit 0
fi
if [ "${1:-}" = "--install" ]; then
  echo "node-for-sdks: installing node@22 from the npm registry into .tools/node" >&2
  mkdir -p "$root/.tools/node"
  (cd "$root/.tools/node" && npm install --no-audit --no-fund --loglevel=error node@22 >&2)
  if [ -x "$local_node" ] && ok "$local_node"; then
    echo "$local_node"
    exit 0
  fi
fi
echo "node-for-sdks: no node >= 20.18.1 (run scripts/install-deps.sh)" >&2
exit 1
