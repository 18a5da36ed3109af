#!/usr/bin/env bash
# Installs what building, running and testing the broker needs, from Debian 12
# packages. Installs only what is missing; safe to run again.
#
#   install-deps.sh           everything: the daemon, the tests and CI's jobs
#   install-deps.sh --daemon  only what building and running the daemon needs
#                             (scripts/quickstart.sh)
set -euo pipefail

# Building sandbox-brokerd, sandboxctl and sandbox-init, and what the local
# provider runs (bubblewrap, the interpreters, mkfs.ext4 and mount for the
# workspace disk).
DAEMON_PACKAGES=(
  build-essential cmake pkg-config ca-certificates
  libgrpc++-dev protobuf-compiler-grpc libprotobuf-dev protobuf-compiler
  libabsl-dev nlohmann-json3-dev libcurl4-openssl-dev prometheus-cpp-dev
  libseccomp-dev libsqlite3-dev libevent-dev libssl-dev
  libnftables-dev  # network policies: nftables in each sandbox's namespace
  bubblewrap python3 e2fsprogs mount procps
  # Code contexts (docs/api.md#code-contexts): IPython kernels in the sandbox.
  python3-ipykernel python3-jupyter-client
)
# The tests, the judges and CI's jobs.
TEST_PACKAGES=(
  git openssl curl libgtest-dev libgmock-dev libcpp-httplib-dev python3-grpcio python3-yaml
  podman runc catatonit debootstrap  # deploy/podman-ci.sh: the container image job
  # Hardening: libFuzzer targets (scripts/fuzz.sh) build with clang.
  clang-14 libfuzzer-14-dev
  etcd-server etcd-client  # the etcd store's tests start a real etcd
  python3-matplotlib python3-pandas  # code contexts' charts and tables
  ccache  # the sanitizer builds, and the image build sharing the quick start's objects
)
daemon_only=false
[ "${1:-}" = --daemon ] && daemon_only=true
PACKAGES=("${DAEMON_PACKAGES[@]}")
$daemon_only || PACKAGES+=("${TEST_PACKAGES[@]}")
# The local provider runs node; keep a node that is already there (it may be
# newer than Debian's), else take Debian's.
command -v node >/dev/null 2>&1 || PACKAGES+=(nodejs)
$daemon_only || command -v npm >/dev/null 2>&1 || PACKAGES+=(npm)

missing=()
for p in "${PACKAGES[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "install-deps: installing ${missing[*]}" >&2
  SUDO=""
  [ "$(id -u)" -eq 0 ] || SUDO="sudo"
  export DEBIAN_FRONTEND=noninteractive
  $SUDO apt-get update -q
  $SUDO apt-get install -y -q --no-install-recommends "${missing[@]}"
fi

$daemon_only && exit 0

# npm packages (lockfiles committed), for the example clients and the
# conformance tests.
root=$(cd "$(dirname "$0")/.." && pwd)
for dir in examples/node tests/conformance/e2b tests/conformance/daytona tests/mcp; do
  if [ -f "$root/$dir/package-lock.json" ] && [ ! -d "$root/$dir/node_modules" ]; then
    echo "install-deps: npm ci in $dir" >&2
    (cd "$root/$dir" && npm ci --no-audit --no-fund --loglevel=error)
  fi
done

# The official SDKs need a newer node than a fresh Debian's.
bash "$root/scripts/node-for-sdks.sh" --install >/dev/null
# The MCP conformance tool needs Node >= 22 (fs.globSync).
NODE_MIN_MAJOR=22 bash "$root/scripts/node-for-sdks.sh" --install >/dev/null
