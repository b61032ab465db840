# Script and integration tests that drive the real binary (included from CMakeLists.txt).

# server
find_program(NODE_EXECUTABLE node)
if(NODE_EXECUTABLE)
  foreach(t openai preemption bench_serving)
    add_test(NAME server_${t} COMMAND ${NODE_EXECUTABLE} --test ${CMAKE_SOURCE_DIR}/tests/server/${t}.test.mjs)
    set_tests_properties(server_${t} PROPERTIES ENVIRONMENT "TOKENSPEED_BIN=$<TARGET_FILE:tokenspeed>"
      LABELS server TIMEOUT 900)
  endforeach()
endif()
