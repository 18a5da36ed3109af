#!/usr/bin/env bash
# Quick start: installs only what the daemon needs (apt), builds only
# sandbox-brokerd, sandboxctl and sandbox-init (tests off), and serves the
# local provider on 127.0.0.1:50051 (foreground; Ctrl-C stops it).
# Extra arguments go to sandbox-brokerd (e.g. --config FILE, --listen ADDR).
# Works from wherever the project was cloned (/root/project included).
#
# env: BUILD_DIR (default build), JOBS (default 2),
#      QUICKSTART_NO_SERVE=1 builds and stops there.
set -euo pipefail
cd "$(dirname "$0")/.."
build=${BUILD_DIR:-build}
bash scripts/install-deps.sh --daemon
# A compiler cache when the machine has one (CI's image build shares it).
launcher=()
if command -v ccache >/dev/null 2>&1; then
  export CCACHE_BASEDIR="$PWD" CCACHE_COMPILERCHECK=content
  # ccache hashes the locale: the same as the image build's.
  unset LC_ALL LC_CTYPE LC_MESSAGES
  export LANG=C.UTF-8
  launcher=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache -DCMAKE_C_COMPILER_LAUNCHER=ccache)
fi
cmake -S . -B "$build" -DCMAKE_BUILD_TYPE="${BUILD_TYPE:-Release}" \
  -DSANDBOX_BROKER_TESTS=OFF "${launcher[@]}" >/dev/null
cmake --build "$build" -j"${JOBS:-2}" --target sandbox-brokerd sandboxctl sandbox-init
[ -n "${QUICKSTART_NO_SERVE:-}" ] && exit 0
exec "./$build/sandbox-brokerd" "$@"
