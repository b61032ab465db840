# Script tests that drive the real binary (included from the top-level CMakeLists.txt).

# tokenizer
add_test(NAME cli_tokenize COMMAND bash ${CMAKE_SOURCE_DIR}/tests/cli/tokenize_test.sh $<TARGET_FILE:tokenspeed>)
set_tests_properties(cli_tokenize PROPERTIES LABELS "cli;tokenizer")
