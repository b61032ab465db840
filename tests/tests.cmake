# Script tests that drive the real binary. Each feature keeps its lines under its own header.

# bench
add_test(NAME cli_bench COMMAND bash ${CMAKE_SOURCE_DIR}/tests/cli/bench_test.sh $<TARGET_FILE:tokenspeed>)
set_tests_properties(cli_bench PROPERTIES LABELS "cli;bench" TIMEOUT 300)
