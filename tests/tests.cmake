# Script tests that drive the real binary. Each feature keeps its lines under its own header.

# bench agentic
add_test(NAME bench_agentic_help COMMAND tokenspeed bench agentic --help)
set_tests_properties(bench_agentic_help PROPERTIES LABELS "cli;bench"
  PASS_REGULAR_EXPRESSION "--concurrency.*--first-turn-tokens.*--turns.*--ignore-eos.*--warmup.*--num-gpus.*--tokenizer.*--timeout")
add_test(NAME bench_agentic_smoke
  COMMAND bash ${CMAKE_SOURCE_DIR}/tests/bench/agentic_smoke.sh $<TARGET_FILE:tokenspeed>)
set_tests_properties(bench_agentic_smoke PROPERTIES LABELS "server;bench" TIMEOUT 180 SKIP_RETURN_CODE 77)
