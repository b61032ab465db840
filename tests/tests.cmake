# Script tests that drive the real binary (included from the top-level CMakeLists.txt).

# tokenizer
add_test(NAME cli_tokenize COMMAND bash ${CMAKE_SOURCE_DIR}/tests/cli/tokenize_test.sh $<TARGET_FILE:tokenspeed>)
set_tests_properties(cli_tokenize PROPERTIES LABELS "cli;tokenizer")

# bench agentic
add_test(NAME bench_agentic_help COMMAND tokenspeed bench agentic --help)
set_tests_properties(bench_agentic_help PROPERTIES LABELS "cli;bench"
  PASS_REGULAR_EXPRESSION "--concurrency.*--first-turn-tokens.*--turns.*--ignore-eos.*--warmup.*--num-gpus.*--tokenizer.*--timeout")
add_test(NAME bench_agentic_smoke
  COMMAND bash ${CMAKE_SOURCE_DIR}/tests/bench/agentic_smoke.sh $<TARGET_FILE:tokenspeed>)
set_tests_properties(bench_agentic_smoke PROPERTIES LABELS "server;bench" TIMEOUT 180 SKIP_RETURN_CODE 77)
