# libFuzzer targets (TS_FUZZ=ON, clang only): the parsers that take untrusted input. Built into
# their own library of just the sources they need, instrumented for coverage + ASan + UBSan, so a
# fuzz build does not compile the whole engine. scripts/fuzz.sh configures build-fuzz/ and runs them.
if(NOT CMAKE_CXX_COMPILER_ID MATCHES "Clang")
  message(FATAL_ERROR "TS_FUZZ needs clang (CC=clang CXX=clang++; scripts/fuzz.sh does this)")
endif()
set(TS_FUZZ_SAN -fsanitize=address,undefined -fno-sanitize-recover=undefined -fno-omit-frame-pointer -g -O1)
file(GLOB TS_FUZZ_LIB_SOURCES CONFIGURE_DEPENDS
  src/io/*.cpp src/tokenizer/*.cpp src/chat/*.cpp src/core/log.cpp src/core/tensor.cpp src/core/device_memory.cpp
  src/server/protocol.cpp src/server/http/request_parse.cpp src/grammar/*.cpp)
add_library(tsfuzz STATIC ${TS_FUZZ_LIB_SOURCES})
target_include_directories(tsfuzz PUBLIC src ${CMAKE_BINARY_DIR}/generated ${XXHASH_INCLUDE})
target_compile_options(tsfuzz PRIVATE -fsanitize=fuzzer-no-link ${TS_FUZZ_SAN} ${TS_CPU_FLAGS})
target_link_libraries(tsfuzz PUBLIC PkgConfig::PCRE2 nlohmann_json::nlohmann_json fmt::fmt spdlog::spdlog
  ${XXHASH_LIB} Threads::Threads)
add_custom_target(fuzz_all)
foreach(t protocol config safetensors tokenizer chat_template http grammar)
  add_executable(fuzz_${t} tests/fuzz/fuzz_${t}.cpp)
  target_compile_options(fuzz_${t} PRIVATE -fsanitize=fuzzer ${TS_FUZZ_SAN})
  target_link_options(fuzz_${t} PRIVATE -fsanitize=fuzzer ${TS_FUZZ_SAN})
  target_link_libraries(fuzz_${t} PRIVATE tsfuzz)
  add_dependencies(fuzz_all fuzz_${t})
endforeach()
# The unit tests of the same parsers, built with the same sanitizers (ASan + UBSan, sanitizer
# coverage without libFuzzer): scripts/fuzz.sh runs them after the fuzzers, so a memory error or
# undefined behaviour on the tests' own inputs fails CI too.
file(GLOB TS_SAN_TEST_SOURCES CONFIGURE_DEPENDS tests/unit/io/*.cpp tests/unit/tokenizer/*.cpp tests/unit/chat/*.cpp
  tests/unit/grammar/*.cpp tests/unit/server/protocol_test.cpp tests/unit/server/protocol_limits_test.cpp
  tests/unit/server/http_request_parse_test.cpp)
add_executable(san_unit_tests ${TS_SAN_TEST_SOURCES})
target_compile_options(san_unit_tests PRIVATE ${TS_FUZZ_SAN})
target_link_options(san_unit_tests PRIVATE ${TS_FUZZ_SAN})
target_link_libraries(san_unit_tests PRIVATE tsfuzz GTest::gtest GTest::gtest_main)
