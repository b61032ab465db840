// OutputProcessor on the demo tokenizer: streamed deltas add up to the decoded text, stop
// strings are cut (or kept) wherever they fall across tokens and end the text, final stop ids
// add no text, and no delta splits a UTF-8 character.
#include "ts_source_dir.h"  // TS_SOURCE_DIR (generated: the checkout's path)
#include <gtest/gtest.h>

#include "server/output_processor.h"
#include "tokenizer/tokenizer.h"

using namespace ts;
using namespace ts::server;

namespace {

std::shared_ptr<const tok::Tokenizer> demo_tok() {
  static auto t = tok::Tokenizer::from_dir(std::string(TS_SOURCE_DIR) + "/models/pycoder");
  return t;
}

StreamEvent tokens_event(std::vector<int32_t> ids, bool finished = false, FinishReason r = FinishReason::none) {
  StreamEvent ev;
  ev.tokens = std::move(ids);
  ev.finished = finished;
  ev.reason = r;
  return ev;
}

// Feeds ids one event per token (the last event final with `reason`); returns the deltas.
std::vector<std::string> stream(OutputProcessor& op, const std::vector<int32_t>& ids, FinishReason reason) {
  std::vector<std::string> out;
  for (size_t i = 0; i < ids.size(); ++i) {
    bool last = i + 1 == ids.size();
    out.push_back(op.feed(tokens_event({ids[i]}, last, last ? reason : FinishReason::none)).text);
  }
  return out;
}

std::string join(const std::vector<std::string>& v) {
  std::string s;
  for (auto& x : v) s += x;
  return s;
}

bool valid_utf8(const std::string& s) {
  size_t i = 0;
  while (i < s.size()) {
    unsigned char c = static_cast<unsigned char>(s[i]);
    int n = c < 0x80 ? 1 : (c >> 5) == 6 ? 2 : (c >> 4) == 14 ? 3 : (c >> 3) == 30 ? 4 : 0;
    if (n == 0 || i + size_t(n) > s.size()) return false;
    for (int k = 1; k < n; ++k)
      if ((static_cast<unsigned char>(s[i + size_t(k)]) & 0xC0) != 0x80) return false;
    i += size_t(n);
  }
  return true;
}

TEST(OutputProcessor, DeltasAddUpToTheDecodedText) {
  auto tok = demo_tok();
  std::string text = "def fib(n):\n    return n if n < 2 else fib(n - 1) + fib(n - 2)  # héllo → ünïcode ✓\n";
  auto ids = tok->encode(text, false);
  OutputProcessor op(tok, {});
  auto deltas = stream(op, ids, FinishReason::length);
  EXPECT_EQ(join(deltas), tok->decode(ids, true));
  for (auto& d : deltas) EXPECT_TRUE(valid_utf8(d)) << d;
}

TEST(OutputProcessor, StopStringAcrossTokensIsCutAndEndsTheText) {
  auto tok = demo_tok();
  std::string text = "x = 1\nprint(x)\n# END of file\nmore = 2\n";
  auto ids = tok->encode(text, false);
  for (bool include : {false, true}) {
    OutputOptions o;
    o.stop = {"never-there", "END of"};
    o.include_stop_str = include;
    OutputProcessor op(tok, o);
    std::string got;
    int counted = 0;
    for (size_t i = 0; i < ids.size(); ++i) {
      auto d = op.feed(tokens_event({ids[i]}));
      got += d.text;
      counted += d.tokens;
      if (op.stopped()) {
        // Later tokens are ignored.
        auto later = op.feed(tokens_event({ids[0]}, true, FinishReason::stop));
        EXPECT_TRUE(later.text.empty());
        EXPECT_EQ(later.tokens, 0);
        break;
      }
    }
    ASSERT_TRUE(op.stopped());
    EXPECT_EQ(op.stop_str(), "END of");
    EXPECT_EQ(got, include ? "x = 1\nprint(x)\n# END of" : "x = 1\nprint(x)\n# ");
    EXPECT_LT(counted, int(ids.size()));
  }
}

TEST(OutputProcessor, TextThatMayBecomeAStopStringIsHeldBack) {
  auto tok = demo_tok();
  OutputOptions o;
  o.stop = {"abcdef"};
  OutputProcessor op(tok, o);
  auto ids = tok->encode("abc", false);
  std::string sent;
  for (auto id : ids) sent += op.feed(tokens_event({id})).text;
  EXPECT_EQ(sent, "");  // "abc" could still become "abcdef"
  auto rest = tok->encode("xyz", false);
  for (size_t i = 0; i < rest.size(); ++i) {
    bool last = i + 1 == rest.size();
    sent += op.feed(tokens_event({rest[i]}, last, last ? FinishReason::length : FinishReason::none)).text;
  }
  EXPECT_EQ(sent, "abcxyz");
  EXPECT_FALSE(op.stopped());
}

TEST(OutputProcessor, FinalStopIdAddsNoText) {
  auto tok = demo_tok();
  auto ids = tok->encode("hello world", false);
  int32_t stop_id = tok->encode(" world", false).back();
  OutputOptions o;
  o.stop_ids = {stop_id};
  o.skip_special = true;
  {
    OutputProcessor op(tok, o);
    std::vector<int32_t> all = tok->encode("hello", false);
    all.push_back(stop_id);
    EXPECT_EQ(join(stream(op, all, FinishReason::stop)), "hello");
  }
  {
    // The same id ending on length (not a stop) is text.
    OutputProcessor op(tok, o);
    std::vector<int32_t> all = tok->encode("hello", false);
    all.push_back(stop_id);
    EXPECT_EQ(join(stream(op, all, FinishReason::length)), tok->decode(all, true));
  }
}

// vLLM's include_stop_str_in_output also keeps a stop_token_ids id's text (EOS still adds none).
TEST(AttachOutputProcessor, IncludeStopStrKeepsAStopTokenIdsText) {
  auto tok = demo_tok();
  std::vector<int32_t> ids = tok->encode("x = 1", false);
  const int32_t stop_id = ids.back();
  for (bool include : {false, true}) {
    GenerateParams p;
    p.stop_token_ids = {stop_id};
    Stream st;
    attach_output_processor(st, tok, p, {}, include, nullptr);
    for (size_t i = 0; i < ids.size(); ++i) {
      const bool last = i + 1 == ids.size();
      st.push(tokens_event({ids[i]}, last, last ? FinishReason::stop : FinishReason::none));
    }
    std::string text;
    StreamEvent ev;
    while (st.try_pop(ev)) {
      text += ev.text;
      if (ev.finished) break;
    }
    std::vector<int32_t> head(ids.begin(), ids.end() - 1);
    EXPECT_EQ(text, include ? tok->decode(ids, true) : tok->decode(head, true)) << include;
  }
}

TEST(OutputProcessor, OptionsFromParams) {
  GenerateParams p;
  p.stop = {"\n\n"};
  p.stop_token_ids = {7};
  auto o = output_options(p, {2, 3});
  EXPECT_EQ(o.stop_ids, (std::unordered_set<int32_t>{2, 3, 7}));
  p.ignore_eos = true;
  EXPECT_EQ(output_options(p, {2, 3}).stop_ids, (std::unordered_set<int32_t>{7}));
}

}  // namespace

namespace {

// attach_output_processor: the Stream's filter makes the text on the popping thread; a stop
// string asks the engine to stop and drops the tokens after the match.
TEST(AttachOutputProcessor, FilterMakesTextAndStopsTheStream) {
  auto tok = demo_tok();
  std::vector<int32_t> ids = tok->encode("x = 1\ny = 2\nz = 3\n", false);
  ASSERT_GT(ids.size(), 6u);
  GenerateParams p;
  p.stop = {"y ="};
  Stream st;
  attach_output_processor(st, tok, p, {});
  for (size_t i = 0; i < ids.size(); ++i) {
    StreamEvent ev = tokens_event({ids[i]}, i + 1 == ids.size(), i + 1 == ids.size() ? FinishReason::length : FinishReason::none);
    ev.completion_tokens = int(i + 1);
    st.push(std::move(ev));
  }
  std::string text;
  size_t kept = 0;
  StreamEvent ev;
  while (st.try_pop(ev)) {
    text += ev.text;
    kept += ev.tokens.size();
    if (ev.finished) break;
  }
  EXPECT_EQ(text, "x = 1\n");
  EXPECT_TRUE(st.stop_requested());
  EXPECT_TRUE(ev.finished);
  EXPECT_EQ(ev.reason, FinishReason::stop);  // the match, not the engine's length, ends it
  EXPECT_EQ(ev.completion_tokens, int(kept));
  EXPECT_LT(kept, ids.size());
}

}  // namespace
