#!/usr/bin/env bash
# Runs one example client (python or node) against a live broker started
# from BUILD_DIR on 127.0.0.1:0. Usage: run_example.sh BUILD_DIR python|node
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
build=$(cd "$1" && pwd)
which=$2
tmp=$(mktemp -d)
pid=""
cleanup() {
  [ -n "$pid" ] && kill "$pid" 2>/dev/null && wait "$pid" 2>/dev/null || true
  rm -rf "$tmp"
}
trap cleanup EXIT
chmod 711 "$tmp"
uid_base=$([ "$which" = python ] && echo 630000 || echo 640000)
cat > "$tmp/config.json" <<JSON
{"listen": "127.0.0.1:0", "auth": {"tokens": {"example-token-1": "examples"}},
 "state": {"path": "$tmp/state.db"},
 "providers": {"local": {"workspace_root": "$tmp/ws", "uid_base": $uid_base}}}
JSON
"$build/sandbox-brokerd" --config "$tmp/config.json" 2>"$tmp/broker.log" &
pid=$!
addr=""
for _ in $(seq 300); do  # wait for startup (the log names the bound address)
  addr=$(grep -o 'broker.serving address=[0-9.:]*' "$tmp/broker.log" | cut -d= -f2 || true)
  [ -n "$addr" ] && break
  kill -0 "$pid" 2>/dev/null || { cat "$tmp/broker.log"; exit 1; }
  sleep 0.1
done
[ -n "$addr" ] || { echo "broker did not start"; cat "$tmp/broker.log"; exit 1; }

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
