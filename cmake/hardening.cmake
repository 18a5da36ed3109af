# Hardening builds (docs/hardening.md).
#
# SANDBOX_BROKER_SANITIZE=address: AddressSanitizer + UndefinedBehaviorSanitizer
#   (any UB report aborts, so a test fails on it). Used with gcc, the project's
#   compiler: Debian's gRPC/protobuf/Abseil are gcc-built and ccache is warm
#   for gcc, and gcc 12's ASan/UBSan are complete for this code.
# SANDBOX_BROKER_SANITIZE=thread: ThreadSanitizer, gcc as well. Debian's
#   Abseil is not TSan-instrumented, so absl::Mutex would be invisible to TSan;
#   tests/sanitizers/tsan_absl_shim.cc (linked into TSan builds only) tells
#   TSan about every absl::Mutex/CondVar acquire and release.
# SANDBOX_BROKER_FUZZ=ON: libFuzzer targets in fuzz/ (clang-14 only: gcc has
#   no libFuzzer). Everything compiled with ASan+UBSan and coverage.
set(SANDBOX_BROKER_SANITIZE "" CACHE STRING "Sanitizer build: '', address or thread")
set_property(CACHE SANDBOX_BROKER_SANITIZE PROPERTY STRINGS "" address thread)
option(SANDBOX_BROKER_FUZZ "Build the libFuzzer targets (needs clang)" OFF)

if(SANDBOX_BROKER_SANITIZE STREQUAL "address")
  # -O1 -g1: fast enough to run, quick to compile and link, line numbers in
  # reports.
  add_compile_options(-O1 -g1 -fno-omit-frame-pointer -fsanitize=address,undefined
    -fno-sanitize-recover=all)
  add_link_options(-fsanitize=address,undefined)
  add_compile_definitions(SANDBOX_BROKER_ASAN=1)
elseif(SANDBOX_BROKER_SANITIZE STREQUAL "thread")
  add_compile_options(-O1 -g1 -fno-omit-frame-pointer -fsanitize=thread)
  add_link_options(-fsanitize=thread)
  add_compile_definitions(SANDBOX_BROKER_TSAN=1)
elseif(NOT SANDBOX_BROKER_SANITIZE STREQUAL "")
  message(FATAL_ERROR "SANDBOX_BROKER_SANITIZE must be '', address or thread")
endif()

if(SANDBOX_BROKER_FUZZ)
  if(NOT CMAKE_CXX_COMPILER_ID STREQUAL "Clang")
    message(FATAL_ERROR "SANDBOX_BROKER_FUZZ needs clang (-DCMAKE_CXX_COMPILER=clang++-14)")
  endif()
  if(NOT SANDBOX_BROKER_SANITIZE STREQUAL "")
    message(FATAL_ERROR "SANDBOX_BROKER_FUZZ brings its own sanitizers")
  endif()
  add_compile_options(-O1 -g1 -fno-omit-frame-pointer
    -fsanitize=fuzzer-no-link,address,undefined -fno-sanitize-recover=all)
  add_link_options(-fsanitize=address,undefined)
endif()
