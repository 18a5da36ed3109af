# Hardening targets (docs/hardening.md); included after every other target.
add_subdirectory(fuzz)

if(SANDBOX_BROKER_TESTS)
  # The soak harness: drives a real sandbox-brokerd process (bench/broker_soak.cc).
  add_executable(broker_soak bench/broker_soak.cc)
  target_link_libraries(broker_soak PRIVATE broker_proto common)
  target_compile_definitions(broker_soak PRIVATE BROKERD_PATH="$<TARGET_FILE:sandbox-brokerd>")
  add_dependencies(broker_soak sandbox-brokerd)
  # Short versions, so the harness cannot rot (the 10-minute figures are in
  # docs/hardening.md).
  add_test(NAME soak_short_echo COMMAND broker_soak --provider=echo --duration=15 --workers=4
    --sessions=1000 --sample=1)
  add_test(NAME soak_short_local COMMAND broker_soak --provider=local --duration=30 --workers=4
    --sessions=1000 --sample=2)
  set_tests_properties(soak_short_echo soak_short_local PROPERTIES TIMEOUT 300
    LABELS integration)
endif()

if(SANDBOX_BROKER_SANITIZE STREQUAL "thread")
  # See tests/sanitizers/tsan_absl_shim.cc: makes Debian's uninstrumented
  # absl::Mutex visible to TSan. Every executable that runs under TSan.
  # Compiled on its own, never in a unity batch: it wraps absl's symbols.
  set_source_files_properties(${PROJECT_SOURCE_DIR}/tests/sanitizers/tsan_absl_shim.cc
    PROPERTIES SKIP_UNITY_BUILD_INCLUSION ON)
  foreach(t sandbox-brokerd broker_tests sandboxctl fake-e2b fake-daytona broker_bench broker_soak)
    if(TARGET ${t})
      target_sources(${t} PRIVATE ${PROJECT_SOURCE_DIR}/tests/sanitizers/tsan_absl_shim.cc)
      target_link_libraries(${t} PRIVATE ${CMAKE_DL_LIBS})
    endif()
  endforeach()
endif()
