#!/usr/bin/env bash
# Runs one example client (python or node) against a live broker started
# from BUILD_DIR on 127.0.0.1:0. Usage: run_example.sh BUILD_DIR python|node
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
build=$(cd "$1" && pwd)
which=$2
source "$root/tests/testing/broker.sh"
uid_base=$([ "$which" = python ] && echo 630000 || echo 640000)
cat > "$tmp/config.json" <<JSON
{"listen": "127.0.0.1:0", "auth": {"tokens": {"example-token-1": "examples"}},
 "state": {"path": "$tmp/state.db"},
 "providers": {"local": {"workspace_root": "$tmp/ws", "uid_base": $uid_base}}}
JSON
start_broker "$build/sandbox-brokerd" "$tmp/config.json"

case "$which" in
  python)
    mkdir -p "$tmp/gen"
    protoc -I "$root/proto" --python_out="$tmp/gen" --grpc_out="$tmp/gen" \
      --plugin=protoc-gen-grpc="$(command -v grpc_python_plugin)" \
      "$root/proto/sandboxbroker/v1/broker.proto"
    PYTHONPATH="$tmp/gen" /usr/bin/python3 "$root/examples/python/example.py" \
      --addr "$addr" --token example-token-1
    ;;
  node)
    [ -d "$root/examples/node/node_modules" ] || { echo "run: (cd examples/node && npm ci)"; exit 1; }
    node "$root/examples/node/example.js" --addr "$addr" --token example-token-1
    ;;
  *) echo "usage: $0 BUILD_DIR python|node"; exit 2 ;;
esac
