# libFuzzer targets (TS_FUZZ=ON, clang only): the parsers that take untrusted input. TS_FUZZ turns
# on TS_SANITIZE, so the whole engine is already built with ASan + UBSan; the parsers' sources get
# libFuzzer's coverage instrumentation on top (-fsanitize=fuzzer-no-link: the sanitizer runtime
# supplies its hooks, so the same objects link into tokenspeed and the unit tests too, where the
# hooks cost little), and each fuzzer links the engine's layer libraries. scripts/fuzz.sh runs them;
# scripts/sanitize.sh runs the unit and server tests from the same build.
if(NOT CMAKE_CXX_COMPILER_ID MATCHES "Clang")
  message(FATAL_ERROR "TS_FUZZ needs clang (CC=clang CXX=clang++; scripts/sanitize.sh does this)")
endif()
file(GLOB TS_FUZZ_COVERED_SOURCES CONFIGURE_DEPENDS
  src/io/*.cpp src/tokenizer/*.cpp src/chat/*.cpp src/server/protocol.cpp src/server/http/request_parse.cpp
  src/grammar/*.cpp)
set_source_files_properties(${TS_FUZZ_COVERED_SOURCES} PROPERTIES COMPILE_OPTIONS -fsanitize=fuzzer-no-link)
add_custom_target(fuzz_all)
foreach(t protocol config safetensors tokenizer chat_template http grammar)
  add_executable(fuzz_${t} tests/fuzz/fuzz_${t}.cpp)
  target_compile_options(fuzz_${t} PRIVATE -fsanitize=fuzzer)
  target_link_options(fuzz_${t} PRIVATE -fsanitize=fuzzer)
  target_link_libraries(fuzz_${t} PRIVATE tscore)
  add_dependencies(fuzz_all fuzz_${t})
endforeach()
