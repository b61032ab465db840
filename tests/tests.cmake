# Golden, CLI and server tests: scripts and commands that drive the real binary.
# Included from the top-level CMakeLists.txt (include(tests/tests.cmake OPTIONAL)).

# models
foreach(fixture llama3 llama2_mha qwen3 qwen3_moe deepseek_v3 minimax_m3)
  add_test(NAME golden_${fixture} COMMAND $<TARGET_FILE:tokenspeed> verify-golden ${CMAKE_SOURCE_DIR}/tests/data/${fixture})
  set_tests_properties(golden_${fixture} PROPERTIES LABELS "golden")
endforeach()
# An architecture without a model file must fail loudly, naming the problem.
add_test(NAME cli_unsupported_architecture
  COMMAND sh -c "out=$(\"$0\" verify-golden \"$1\" 2>&1); rc=$?; echo \"$out\"; [ $rc -ne 0 ] && echo \"$out\" | grep -q 'unsupported architecture'"
          $<TARGET_FILE:tokenspeed> ${CMAKE_SOURCE_DIR}/tests/data/qwen3_5)
set_tests_properties(cli_unsupported_architecture PROPERTIES LABELS "cli")
