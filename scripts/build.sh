#!/usr/bin/env bash
# Configures and builds everything into ./build (2 jobs: gRPC compiles slowly).
set -euo pipefail
cd "$(dirname "$0")/.."
cmake -S . -B build -DCMAKE_BUILD_TYPE="${BUILD_TYPE:-RelWithDebInfo}" -DSANDBOX_BROKER_TESTS=ON >/dev/null
cmake --build build -j"${JOBS:-2}"
