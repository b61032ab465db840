// libFuzzer target: the grammar compiler and matcher. Input: a mode byte, a grammar source
// (GBNF, Lark, regex, JSON Schema or a choice list) up to the first NUL, then bytes that steer a
// walk: at each step the matcher's bitmask is filled and the walk takes the k-th allowed token.
// Invariants (abort = finding): a token the mask allows is accepted; a token it forbids is
// refused; rollback restores the mask exactly. Sources the compiler refuses (ts::Error) are fine, so
// is a state the matcher refuses to step through (too ambiguous); taking seconds is not.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "core/error.h"
#include "grammar/ir.h"
#include "grammar/json_schema.h"
#include "grammar/matcher.h"

using namespace ts::grammar;

namespace {

// 256 single bytes, some multi-byte tokens a JSON grammar meets, and a stop token.
std::shared_ptr<const Vocab> small_vocab() {
  static std::shared_ptr<const Vocab> v = [] {
    std::vector<std::string> toks;
    for (int b = 0; b < 256; ++b) toks.emplace_back(1, static_cast<char>(b));
    for (const char* t : {"{\"", "\":", "\": \"", "\",", "true", "false", "null", "  ", "\n", "ab", "abc", "123",
                          "\\u00", "é", "\xe2\x82", "\xac", "}", "]}", "[{\"", ", \"", "0.5", "-1e", "</s>"})
      toks.emplace_back(t);
    std::vector<bool> excluded(toks.size(), false);
    int32_t stop = static_cast<int32_t>(toks.size());
    toks.emplace_back("");  // the stop token: no bytes
    excluded.push_back(false);
    return std::make_shared<const Vocab>(std::move(toks), std::move(excluded), std::vector<int32_t>{stop});
  }();
  return v;
}

bool allowed(const std::vector<uint32_t>& row, int32_t id) { return (row[id >> 5] >> (id & 31)) & 1u; }

// Steps the matcher as the input's walk bytes say; abort() on a broken invariant.
void walk_grammar(const std::shared_ptr<const CompiledGrammar>& cg, const uint8_t* walk, size_t walk_len) {
  Matcher m(cg);
  const auto& vocab = small_vocab();
  const int32_t n = vocab->size();
  std::vector<uint32_t> row((n + 31) / 32), again(row.size());
  for (size_t i = 0; i < walk_len && !m.is_terminated(); ++i) {
    m.fill_bitmask(row.data());
    std::vector<int32_t> ok;
    for (int32_t id = 0; id < n; ++id)
      if (allowed(row, id)) ok.push_back(id);
    // A forbidden token must be refused (and leave the state unchanged).
    int32_t probe = walk[i] % n;
    if (!allowed(row, probe)) {
      if (m.accept_token(probe)) abort();
    }
    if (ok.empty()) break;
    int32_t pick = ok[walk[i] % ok.size()];
    if (!m.accept_token(pick)) abort();
    // Every few steps: undo and redo, the mask must come back the same.
    if ((walk[i] & 0x30) == 0x30 && m.num_rollback() > 0 && !m.is_terminated()) {
      m.rollback(1);
      m.fill_bitmask(again.data());
      if (again != row) abort();
      if (!m.accept_token(pick)) abort();
    }
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 1) return 0;
  uint8_t mode = data[0] % 5;
  const char* src = reinterpret_cast<const char*>(data + 1);
  size_t src_len = strnlen(src, size - 1);
  std::string source(src, src_len);
  const uint8_t* walk = data + 1 + src_len + (src_len < size - 1 ? 1 : 0);
  size_t walk_len = size - static_cast<size_t>(walk - data);
  auto vocab = small_vocab();
  std::shared_ptr<const CompiledGrammar> cg;
  try {
    Grammar g;
    switch (mode) {
      case 0: g = parse_gbnf(source); break;
      case 1: g = parse_lark(source); break;
      case 2: g = regex_grammar(source); break;
      case 3: g = json_schema_grammar(std::string_view(source), JsonSchemaOptions{.lenient = (data[0] & 0x80) != 0}); break;
      default: {
        std::vector<std::string> choices;
        size_t a = 0;
        for (size_t i = 0; i <= source.size(); ++i)
          if (i == source.size() || source[i] == '\n') {
            choices.push_back(source.substr(a, i - a));
            a = i + 1;
          }
        g = choice_grammar(choices);
      }
    }
    cg = std::make_shared<const CompiledGrammar>(g, vocab);
  } catch (const ts::Error&) {
    return 0;
  }
  try {
    walk_grammar(cg, walk, walk_len);
  } catch (const ts::Error&) {
    // A grammar past the matcher's per-step bound at some state (too ambiguous) or too deep:
    // refused there (the server ends that request's output), not a finding.
  }
  return 0;
}
