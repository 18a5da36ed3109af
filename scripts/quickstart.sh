#!/usr/bin/env bash
# Quick start: installs what is missing, builds, and runs the broker with the
# local provider on 127.0.0.1:50051 (foreground; Ctrl-C stops it).
# Extra arguments go to sandbox-brokerd (e.g. --config FILE, --listen ADDR).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install-deps.sh
bash scripts/build.sh
exec ./build/sandbox-brokerd "$@"
