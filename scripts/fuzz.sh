#!/usr/bin/env bash
# Runs a libFuzzer target (docs/hardening.md). Usage:
#   scripts/fuzz.sh TARGET SECONDS [libFuzzer flags...]   # e.g. e2b_envelope 60
#   scripts/fuzz.sh all SECONDS                           # every target in turn
#   scripts/fuzz.sh list
# Builds build-fuzz/ with clang-14 (ASan+UBSan+libFuzzer), starts from the
# checked-in seeds (fuzz/corpus/TARGET) plus past regressions
# (fuzz/regressions/TARGET), keeps what it learns in build-fuzz/work/TARGET
# and writes a crashing input to build-fuzz/artifacts/. A crash is a bug:
# fix it and check the input in under fuzz/regressions/TARGET/ (the ctest
# fuzz_replay_TARGET replays it in every build).
set -euo pipefail
cd "$(dirname "$0")/.."
target="${1:?usage: fuzz.sh TARGET|all|list SECONDS}"
targets=(e2b_envelope e2b_json daytona_json multipart config tools workspace_fs base64 mcp_http
  egress_wire)
if [ "$target" = list ]; then printf '%s\n' "${targets[@]}"; exit 0; fi
seconds="${2:?usage: fuzz.sh TARGET SECONDS}"
shift 2
cxx="${FUZZ_CXX:-clang++-14}"
launcher=()
command -v ccache >/dev/null 2>&1 && launcher=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache)
cmake -S . -B build-fuzz -DCMAKE_BUILD_TYPE=RelWithDebInfo -DSANDBOX_BROKER_TESTS=OFF \
  -DSANDBOX_BROKER_FUZZ=ON -DCMAKE_CXX_COMPILER="$cxx" "${launcher[@]}" >/dev/null
if [ "$target" = all ]; then run=("${targets[@]}"); else run=("$target"); fi
cmake --build build-fuzz -j"${JOBS:-2}" --target "${run[@]/#/fuzz_}" >/dev/null
export ASAN_OPTIONS="detect_leaks=1:abort_on_error=1"
export UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1"
# One fuzz run: its exit status (0: no finding in SECONDS).
fuzz_one() {
  local t="$1"
  shift
  local work="build-fuzz/work/$t"
  mkdir -p "$work" build-fuzz/artifacts fuzz/regressions/"$t"
  echo "fuzz.sh: $t for ${seconds}s" >&2
  # -rss_limit_mb: the daemon's parsers must not need more than this for a
  # 64 KiB input; -timeout: no input may take a second.
  if ! "build-fuzz/fuzz/fuzz_$t" -max_total_time="$seconds" -max_len=65536 -timeout=10 \
      -rss_limit_mb=2048 -print_final_stats=1 -artifact_prefix="build-fuzz/artifacts/$t-" \
      "$@" "$work" "fuzz/corpus/$t" "fuzz/regressions/$t" 2> "build-fuzz/$t.log"; then
    echo "fuzz.sh: $t FAILED; log: build-fuzz/$t.log, input: build-fuzz/artifacts/$t-*" >&2
    grep -E "ERROR|invariant failed|SUMMARY|runtime error" "build-fuzz/$t.log" | head -5 >&2 || true
    return 1
  fi
  echo "fuzz.sh: $t: $(grep -E "stat::number_of_executed_units" "build-fuzz/$t.log" | tail -1)" >&2
}
# FUZZ_JOBS targets at a time (default: one per core, at most 2): each
# libFuzzer process is single-threaded, so two share a 2-core machine
# without slowing each other.
jobs="${FUZZ_JOBS:-$(( $(nproc) < 2 ? 1 : 2 ))}"
status=0
pids=()
for t in "${run[@]}"; do
  fuzz_one "$t" "$@" &
  pids+=($!)
  if [ "${#pids[@]}" -ge "$jobs" ]; then
    wait "${pids[0]}" || status=1
    pids=("${pids[@]:1}")
  fi
done
for p in "${pids[@]}"; do wait "$p" || status=1; done
exit $status
