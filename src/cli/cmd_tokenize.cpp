// `tokenspeed tokenize`: text -> ids (one JSON list) or, with --decode, ids -> text.
#include <CLI/CLI.hpp>
#include <cstdio>
#include <fstream>
#include <sstream>

#include "cli/commands.h"
#include "core/error.h"
#include "tokenizer/tokenizer.h"

namespace {

std::string read_exact(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  if (!f) ts::fail("cannot open --text-file {}", path);
  std::ostringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

// "1,2,3" (spaces and surrounding [ ] allowed, so a printed id list can be pasted back).
std::vector<int32_t> parse_ids(std::string s) {
  for (char& c : s)
    if (c == '[' || c == ']' || c == ' ' || c == '\n' || c == '\t') c = ' ';
  std::vector<int32_t> ids;
  size_t i = 0;
  while (i < s.size()) {
    size_t e = s.find(',', i);
    if (e == std::string::npos) e = s.size();
    std::string item = s.substr(i, e - i);
    item.erase(0, item.find_first_not_of(' '));
    item.erase(item.find_last_not_of(' ') + 1);
    if (item.empty()) {
      if (e < s.size()) ts::fail("--ids: empty item at offset {}", i);
    } else {
      size_t used = 0;
      long long v = 0;
      try {
        v = std::stoll(item, &used);
      } catch (const std::exception&) {
        used = 0;
      }
      if (used != item.size() || v < INT32_MIN || v > INT32_MAX) ts::fail("--ids: {:?} is not a token id", item);
      ids.push_back(static_cast<int32_t>(v));
    }
    i = e + 1;
  }
  return ids;
}

int cmd_tokenize(int argc, char** argv) {
  CLI::App app{"Encode text to token ids (printed as a JSON list), or decode ids with --decode", "tokenspeed tokenize"};
  std::string tokenizer, text, text_file, ids_arg;
  bool add_special = false, decode = false, skip_special = false;
  app.add_option("--tokenizer", tokenizer, "model directory (tokenizer.json + tokenizer_config.json) or a tokenizer.json path")
      ->required();
  auto* text_opt = app.add_option("--text", text, "text to encode");
  auto* file_opt = app.add_option("--text-file", text_file, "file whose bytes are encoded exactly (nothing stripped)");
  text_opt->excludes(file_opt);
  app.add_flag("--add-special", add_special, "apply the post-processor (e.g. prepend BOS) when encoding");
  auto* dec_opt = app.add_flag("--decode", decode, "decode --ids to text instead (printed with nothing appended)");
  auto* ids_opt = app.add_option("--ids", ids_arg, "comma-separated token ids to decode, e.g. 1,2,3");
  app.add_flag("--skip-special", skip_special, "when decoding, drop special tokens");
  ids_opt->needs(dec_opt);
  dec_opt->excludes(text_opt)->excludes(file_opt);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  }
  if (decode && ids_opt->count() == 0) ts::fail("--decode needs --ids");
  if (!decode && text_opt->count() == 0 && file_opt->count() == 0) ts::fail("give --text or --text-file (or --decode --ids)");

  auto tok = ts::tok::Tokenizer::load(tokenizer);
  if (decode) {
    // Ids a user types are checked against the tokenizer (the decoder itself passes over ids
    // past it: those are a padded LM head's rows in a generation).
    std::vector<int32_t> ids = parse_ids(ids_arg);
    for (int32_t id : ids) tok->check_id(id);
    std::string out = tok->decode(ids, skip_special);
    std::fwrite(out.data(), 1, out.size(), stdout);
    return 0;
  }
  if (file_opt->count()) text = read_exact(text_file);
  std::vector<int32_t> ids = tok->encode(text, add_special);
  std::string out = "[";
  for (size_t i = 0; i < ids.size(); ++i) out += (i ? ", " : "") + std::to_string(ids[i]);
  out += "]\n";
  std::fwrite(out.data(), 1, out.size(), stdout);
  return 0;
}

}  // namespace
TS_COMMAND("tokenize", "encode text to token ids (JSON list) or decode ids to text (--decode)", cmd_tokenize);
