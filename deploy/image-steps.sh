#!/usr/bin/env bash
# The container image's build steps, in one place: the Dockerfile runs them
# (and deploy/podman-ci.sh builds and runs that image in CI).
#
#   image-steps.sh build-deps       build stage: the build packages only
#   image-steps.sh build PREFIX     build stage: packages, compile, install to PREFIX
#   image-steps.sh runtime          runtime stage: runtime packages and the user
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)

BUILD_PACKAGES=(build-essential cmake pkg-config ca-certificates
  libgrpc++-dev protobuf-compiler-grpc libprotobuf-dev protobuf-compiler
  libabsl-dev nlohmann-json3-dev libcurl4-openssl-dev prometheus-cpp-dev
  libseccomp-dev libsqlite3-dev libevent-dev libssl-dev libnftables-dev ccache)
# What sandbox-brokerd and sandboxctl load, and what the local provider runs.
RUNTIME_PACKAGES=(ca-certificates bubblewrap python3 nodejs procps
  libgrpc++1.51 libprotobuf32 libabsl20220623 libcurl4
  libprometheus-cpp-core1.0 libprometheus-cpp-pull1.0 libseccomp2 libnftables1
  libsqlite3-0 libevent-core-2.1-7 libevent-extra-2.1-7 libevent-openssl-2.1-7
  libevent-pthreads-2.1-7
  python3-ipykernel python3-jupyter-client)  # code contexts (IPython kernels)
USER_ID=10001  # and its group's gid: one uid:gid everywhere (10001:10001)

apt_install() {
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -q
  apt-get install -y -q --no-install-recommends "$@"
}

# What apt leaves behind: downloaded .debs (a base image without Docker's
# clean-up hook keeps them), package lists, logs.
apt_clean() {
  apt-get clean
  rm -rf /var/lib/apt/lists/* /var/cache/apt/*.bin /var/cache/apt/archives/*.deb \
    /var/cache/debconf/*-old /var/lib/dpkg/*-old /var/log/apt /var/log/dpkg.log
}

build_deps() {
  missing=()
  for p in "${BUILD_PACKAGES[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
  done
  [ ${#missing[@]} -eq 0 ] || apt_install "${missing[@]}"
}

case "${1:-}" in
  build-deps)
    build_deps
    ;;
  build)
    prefix=${2:?usage: image-steps.sh build PREFIX}
    build_deps
    src=$(cd "$here/.." && pwd)
    build=${IMAGE_BUILD_DIR:-$src/build-image}
    # A compiler cache mounted at /ccache (CI's podman build -v, shared with
    # its quick-start build of the same targets) is used; none otherwise.
    launcher=()
    if [ -d /ccache ] && command -v ccache >/dev/null 2>&1; then
      export CCACHE_DIR=/ccache CCACHE_BASEDIR="$src" CCACHE_COMPILERCHECK=content
      # ccache hashes the locale: the same as quickstart.sh's.
      unset LC_ALL LC_CTYPE LC_MESSAGES
      export LANG=C.UTF-8
      ccache -z >/dev/null  # this build's hits and misses only
      launcher=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache -DCMAKE_C_COMPILER_LAUNCHER=ccache)
    fi
    cmake -S "$src" -B "$build" -DCMAKE_BUILD_TYPE=Release -DSANDBOX_BROKER_TESTS=OFF \
      -DCMAKE_INSTALL_PREFIX="$prefix" "${launcher[@]}" >/dev/null
    cmake --build "$build" -j"${JOBS:-2}" --target sandbox-brokerd sandboxctl sandbox-init
    cmake --install "$build" --strip --component daemon
    [ ${#launcher[@]} -eq 0 ] || ccache --show-stats 2>/dev/null | grep -E "Hits|Misses" || true
    ;;
  runtime)
    apt_install "${RUNTIME_PACKAGES[@]}"
    apt_clean
    groupadd --system --gid "$USER_ID" sandbox-broker
    useradd --system --uid "$USER_ID" --gid "$USER_ID" --home-dir /var/lib/sandbox-broker \
      --create-home --shell /usr/sbin/nologin sandbox-broker
    mkdir -p /var/lib/sandbox-broker/workspaces /etc/sandbox-broker
    chown -R "$USER_ID:$USER_ID" /var/lib/sandbox-broker
    chmod 0711 /var/lib/sandbox-broker /var/lib/sandbox-broker/workspaces
    ;;
  *)
    echo "usage: image-steps.sh build-deps | build PREFIX | runtime" >&2
    exit 2
    ;;
esac
