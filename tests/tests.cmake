# Script tests that drive the real binary (included from the top-level CMakeLists.txt).

# tokenizer
add_test(NAME cli_tokenize COMMAND bash ${CMAKE_SOURCE_DIR}/tests/cli/tokenize_test.sh $<TARGET_FILE:tokenspeed>)
set_tests_properties(cli_tokenize PROPERTIES LABELS "cli;tokenizer")

# server
find_program(NODE_EXECUTABLE node)
if(NODE_EXECUTABLE)
  foreach(t openai preemption bench_serving)
    add_test(NAME server_${t} COMMAND ${NODE_EXECUTABLE} --test ${CMAKE_SOURCE_DIR}/tests/server/${t}.test.mjs)
    set_tests_properties(server_${t} PROPERTIES ENVIRONMENT "TOKENSPEED_BIN=$<TARGET_FILE:tokenspeed>"
      LABELS server TIMEOUT 900)
  endforeach()
endif()
