#!/usr/bin/env bash
# The container image's build steps, in one place: the Dockerfile runs them,
# and CI runs them too (no Docker engine there), so they cannot rot.
#
#   image-steps.sh build PREFIX     build stage: packages, compile, install to PREFIX
#   image-steps.sh runtime          runtime stage: runtime packages and the user
#   image-steps.sh check PREFIX     CI: every library the installed binaries
#                                   load comes from a runtime package (or its
#                                   dependencies), and the packages resolve
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)

BUILD_PACKAGES=(build-essential cmake pkg-config ca-certificates
  libgrpc++-dev protobuf-compiler-grpc libprotobuf-dev protobuf-compiler
  libabsl-dev nlohmann-json3-dev libcurl4-openssl-dev prometheus-cpp-dev
  libgtest-dev libgmock-dev libcpp-httplib-dev libsqlite3-dev)
# What sandbox-brokerd and sandboxctl load, and what the local provider runs.
RUNTIME_PACKAGES=(ca-certificates bubblewrap python3 nodejs
  libgrpc++1.51 libprotobuf32 libabsl20220623 libcurl4
  libprometheus-cpp-core1.0 libprometheus-cpp-pull1.0 libsqlite3-0)
USER_ID=10001

apt_install() {
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -q
  apt-get install -y -q --no-install-recommends "$@"
}

case "${1:-}" in
  build)
    prefix=${2:?usage: image-steps.sh build PREFIX}
    missing=()
    for p in "${BUILD_PACKAGES[@]}"; do
      dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
    done
    [ ${#missing[@]} -eq 0 ] || apt_install "${missing[@]}"
    src=$(cd "$here/.." && pwd)
    build=${IMAGE_BUILD_DIR:-$src/build-image}
    cmake -S "$src" -B "$build" -DCMAKE_BUILD_TYPE=Release -DSANDBOX_BROKER_TESTS=OFF \
      -DCMAKE_INSTALL_PREFIX="$prefix" >/dev/null
    cmake --build "$build" -j"${JOBS:-2}" --target sandbox-brokerd sandboxctl
    cmake --install "$build" --strip
    ;;
  runtime)
    apt_install "${RUNTIME_PACKAGES[@]}"
    rm -rf /var/lib/apt/lists/*
    useradd --system --uid "$USER_ID" --home-dir /var/lib/sandbox-broker --create-home \
      --shell /usr/sbin/nologin sandbox-broker
    mkdir -p /var/lib/sandbox-broker/workspaces /etc/sandbox-broker
    chown -R "$USER_ID:$USER_ID" /var/lib/sandbox-broker
    chmod 0711 /var/lib/sandbox-broker /var/lib/sandbox-broker/workspaces
    ;;
  check)
    prefix=${2:?usage: image-steps.sh check PREFIX}
    for b in sandbox-brokerd sandboxctl; do
      [ -x "$prefix/bin/$b" ] || { echo "image-steps: $prefix/bin/$b missing"; exit 1; }
    done
    "$prefix/bin/sandbox-brokerd" --help >/dev/null
    # Every package the runtime list pulls in, dependencies included.
    allowed=$(apt-cache depends --recurse --no-recommends --no-suggests --no-conflicts \
      --no-breaks --no-replaces --no-enhances "${RUNTIME_PACKAGES[@]}" 2>/dev/null |
      grep -v '^ ' | sed 's/:.*//' | sort -u)
    bad=0
    for lib in $(ldd "$prefix/bin/sandbox-brokerd" "$prefix/bin/sandboxctl" | awk '/=> \//{print $3}' | sort -u); do
      real=$(readlink -f "$lib")
      pkg=$(dpkg -S "$real" 2>/dev/null | head -n1 | cut -d: -f1) || pkg=""
      [ -z "$pkg" ] && pkg=$(dpkg -S "$lib" 2>/dev/null | head -n1 | cut -d: -f1) || true
      if [ -z "$pkg" ] || ! grep -qx "$pkg" <<<"$allowed"; then
        echo "image-steps: $lib (package '${pkg:-?}') is not provided by the runtime packages"
        bad=1
      fi
    done
    apt-get install --simulate -q "${RUNTIME_PACKAGES[@]}" >/dev/null
    [ $bad -eq 0 ] && echo "image-steps: runtime packages cover both binaries"
    exit $bad
    ;;
  *)
    echo "usage: image-steps.sh build PREFIX | runtime | check PREFIX" >&2
    exit 2
    ;;
esac
