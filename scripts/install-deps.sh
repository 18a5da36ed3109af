#!/usr/bin/env bash
# Installs what building, running and testing the broker needs, from Debian 12
# packages. Installs only what is missing; safe to run again.
set -euo pipefail

PACKAGES=(
  build-essential cmake pkg-config git ca-certificates
  libgrpc++-dev protobuf-compiler-grpc libprotobuf-dev protobuf-compiler
  libabsl-dev nlohmann-json3-dev libcurl4-openssl-dev
  libgtest-dev libgmock-dev
  bubblewrap python3
)
# The local provider runs node; keep a node that is already there (it may be
# newer than Debian's), else take Debian's.
command -v node >/dev/null 2>&1 || PACKAGES+=(nodejs)

missing=()
for p in "${PACKAGES[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -eq 0 ]; then
  exit 0
fi
echo "install-deps: installing ${missing[*]}" >&2
SUDO=""
[ "$(id -u)" -eq 0 ] || SUDO="sudo"
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -q
$SUDO apt-get install -y -q --no-install-recommends "${missing[@]}"
