# Sourced by the shell tests that drive a live broker (tests/examples/,
# tests/install/). Sets `tmp` (a fresh 0711 directory, removed at exit) and,
# after start_broker, `pid` and `addr`.
tmp=$(mktemp -d)
chmod 711 "$tmp"
pid=""
addr=""
cleanup() {
  [ -n "$pid" ] && kill "$pid" 2>/dev/null && wait "$pid" 2>/dev/null || true
  rm -rf "$tmp"
}
trap cleanup EXIT

# start_broker BROKERD CONFIG: serves in the background (its log in
# $tmp/broker.log) and waits until the log names the bound address.
start_broker() {
  "$1" --config "$2" 2>"$tmp/broker.log" &
  pid=$!
  for _ in $(seq 300); do
    addr=$(grep -o 'broker.serving address=[0-9.:]*' "$tmp/broker.log" | cut -d= -f2 || true)
    [ -n "$addr" ] && return 0
    kill -0 "$pid" 2>/dev/null || { cat "$tmp/broker.log"; exit 1; }
    sleep 0.1
  done
  echo "broker did not start"
  cat "$tmp/broker.log"
  exit 1
}
