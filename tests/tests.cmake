# Script tests that drive the real binary. Each feature keeps its lines under its own comment.

# chat
add_test(NAME cli_chat_template COMMAND bash ${CMAKE_SOURCE_DIR}/tests/cli/chat_template_test.sh $<TARGET_FILE:tokenspeed>)
set_tests_properties(cli_chat_template PROPERTIES LABELS "cli;chat")
