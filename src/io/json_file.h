// Reading untrusted JSON and model files safely: only regular files are opened (a FIFO or a
// device as a model file would block or never end), sizes are bounded, nesting depth is checked
// by a pre-scan BEFORE the parser or any conversion runs (deep nesting overflows the stack of
// recursive consumers such as the JSON -> Jinja value conversion), and nlohmann's exception texts
// ("[json.exception.parse_error.101] ...") are turned into messages that name the file.
#pragma once
#include <cstddef>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>

namespace ts::io {

// Default nesting limit for request bodies and model JSON files (serve: --max-json-depth).
constexpr int kDefaultMaxJsonDepth = 64;
// Model JSON files (config.json, tokenizer.json, indexes) are read whole; this bounds the read.
constexpr size_t kMaxJsonFileBytes = size_t(1) << 30;

// Deepest array/object nesting in `text` (strings skipped, escapes honoured), stopping as soon as
// it passes `limit` (returns limit + 1 then). Does not validate the JSON otherwise.
int json_depth(std::string_view text, int limit);
// Throws ts::Error "<what>: JSON nesting deeper than <limit> levels" when json_depth > limit.
void check_json_depth(std::string_view text, int limit, std::string_view what);

// The message of a nlohmann exception without its "[json.exception.xxx.NNN] " prefix.
std::string json_error_text(const std::exception& e);

// Opens `path` read-only without blocking and checks it is a regular file; returns the fd and
// its size. Throws ts::Error naming the path (missing, a directory, a FIFO, a device, ...).
int open_regular_file(const std::string& path, size_t& size);
// The whole file (regular files only, at most max_bytes).
std::string read_regular_file(const std::string& path, size_t max_bytes = kMaxJsonFileBytes);
// read_regular_file + depth check + parse; errors name the path ("<path>: invalid JSON: ...").
nlohmann::json read_json_file(const std::string& path, int max_depth = kDefaultMaxJsonDepth);
nlohmann::json parse_json_text(std::string_view text, const std::string& name,
                               int max_depth = kDefaultMaxJsonDepth);

}  // namespace ts::io
