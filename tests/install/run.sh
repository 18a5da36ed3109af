#!/usr/bin/env bash
# The install, as a packager and a consumer see it: `cmake --install` of
# BUILD_DIR into a fresh prefix; sandbox-brokerd served from there (so
# sandbox-init is found in libexec/); a project that find_package()s the
# client library built against the prefix and run against that broker.
# Usage: run.sh BUILD_DIR
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
build=$(cd "$1" && pwd)
source "$here/../testing/broker.sh"
prefix=$tmp/prefix
cmake --install "$build" --prefix "$prefix" >/dev/null
for f in bin/sandbox-brokerd bin/sandboxctl libexec/sandbox-broker/sandbox-init \
  lib/systemd/system/sandbox-brokerd.service share/sandbox-broker/examples/local.json \
  share/sandbox-broker/proto/sandboxbroker/v1/broker.proto \
  include/sandbox_broker/client/remote_sandbox.h lib/cmake/sandbox_broker/sandbox_brokerConfig.cmake; do
  [ -e "$prefix/$f" ] || { echo "install: $f is missing"; exit 1; }
done
[ ! -e "$prefix/bin/sandbox-init" ] || { echo "install: sandbox-init belongs in libexec/"; exit 1; }
# The daemon component alone (the container image's): no client library.
cmake --install "$build" --prefix "$tmp/daemon" --component daemon >/dev/null
[ -x "$tmp/daemon/libexec/sandbox-broker/sandbox-init" ] && [ ! -e "$tmp/daemon/include" ] ||
  { echo "install: --component daemon is the daemon's files only"; exit 1; }
"$prefix/bin/sandbox-brokerd" --version | grep -qx 'sandbox-brokerd [0-9.]*'
"$prefix/bin/sandboxctl" --version | grep -qx 'sandboxctl [0-9.]*'

# The consumer, with the sanitizer flags of an instrumented build.
flags=""
case "$(grep -s '^SANDBOX_BROKER_SANITIZE:' "$build/CMakeCache.txt" | cut -d= -f2)" in
  address) flags="-fsanitize=address,undefined" ;;
  thread) flags="-fsanitize=thread" ;;
esac
cmake -S "$here/consumer" -B "$tmp/consumer" -DCMAKE_PREFIX_PATH="$prefix" \
  -DCMAKE_CXX_FLAGS="$flags" -DCMAKE_EXE_LINKER_FLAGS="$flags" >/dev/null
cmake --build "$tmp/consumer" -j"${JOBS:-2}" >/dev/null

cat >"$tmp/config.json" <<JSON
{"listen": "127.0.0.1:0", "state": {"path": "$tmp/state.db"},
 "providers": {"local": {"workspace_root": "$tmp/ws", "uid_base": 686000}}}
JSON
start_broker "$prefix/bin/sandbox-brokerd" "$tmp/config.json"
out=$("$tmp/consumer/consumer" "$addr")
[ "$out" = 42 ] || { echo "consumer printed '$out', not 42"; exit 1; }
echo "install: prefix layout, --version, find_package(sandbox_broker) and a run through it: ok"
