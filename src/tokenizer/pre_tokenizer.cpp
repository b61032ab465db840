#include "tokenizer/pre_tokenizer.h"

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "tokenizer/json_util.h"
#include "tokenizer/regex.h"
#include "tokenizer/unicode.h"

namespace ts::tok {
namespace {

enum class Behavior { Removed, Isolated, MergedWithPrevious, MergedWithNext, Contiguous };

Behavior parse_behavior(const nlohmann::json& j, const std::string& where, Behavior dflt) {
  if (!j.contains("behavior") || j["behavior"].is_null()) return dflt;
  std::string b = json_string(j, "behavior", where);
  if (b == "Removed") return Behavior::Removed;
  if (b == "Isolated") return Behavior::Isolated;
  if (b == "MergedWithPrevious") return Behavior::MergedWithPrevious;
  if (b == "MergedWithNext") return Behavior::MergedWithNext;
  if (b == "Contiguous") return Behavior::Contiguous;
  fail("tokenizer.json: {}.behavior {:?} is not a split behavior", where, b);
}

struct Seg {
  size_t b, e;
  bool match;
};

// Splits every piece at the matches `find_all(text, fn(b, e))` reports, then groups the
// segments as HF's SplitDelimiterBehavior does; empty results are dropped.
template <typename FindAll>
void split_pieces(PreTokenized& pt, Behavior behavior, bool invert, FindAll&& find_all) {
  std::vector<Piece> out;
  out.reserve(pt.pieces.size() + pt.text.size() / 4 + 4);
  std::vector<Seg> segs, groups;
  for (const Piece& pc : pt.pieces) {
    std::string_view s = pt.piece(pc);
    auto push = [&](size_t b, size_t e) {
      if (e > b) out.push_back({pc.off + static_cast<uint32_t>(b), static_cast<uint32_t>(e - b), pc.first && b == 0});
    };
    if (behavior == Behavior::Isolated && !invert) {  // the common case, without the segment list
      size_t prev = 0;
      find_all(s, [&](size_t b, size_t e) {
        push(prev, b);
        push(b, e);
        prev = e;
      });
      push(prev, s.size());
      continue;
    }
    segs.clear();
    size_t prev = 0;
    find_all(s, [&](size_t b, size_t e) {
      if (b > prev) segs.push_back({prev, b, false});
      segs.push_back({b, e, true});
      prev = e;
    });
    if (prev < s.size()) segs.push_back({prev, s.size(), false});
    if (invert)
      for (Seg& g : segs) g.match = !g.match;
    groups.clear();
    bool prev_match = false;
    switch (behavior) {
      case Behavior::Isolated:
        groups = segs;
        break;
      case Behavior::Removed:
        for (const Seg& g : segs)
          if (!g.match) groups.push_back(g);
        break;
      case Behavior::MergedWithPrevious:
        for (const Seg& g : segs) {
          if (g.match && !prev_match && !groups.empty()) groups.back().e = g.e;
          else groups.push_back(g);
          prev_match = g.match;
        }
        break;
      case Behavior::MergedWithNext:
        for (size_t i = segs.size(); i-- > 0;) {
          const Seg& g = segs[i];
          if (g.match && !prev_match && !groups.empty()) groups.back().b = g.b;
          else groups.push_back(g);
          prev_match = g.match;
        }
        std::reverse(groups.begin(), groups.end());
        break;
      case Behavior::Contiguous:
        for (const Seg& g : segs) {
          if (g.match == prev_match && !groups.empty()) groups.back().e = g.e;
          else groups.push_back(g);
          prev_match = g.match;
        }
        break;
    }
    for (const Seg& g : groups) push(g.b, g.e);
  }
  pt.pieces = std::move(out);
}

// Rewrites each piece with f(text, first, out) into fresh storage.
template <typename F>
void transform_pieces(PreTokenized& pt, F&& f) {
  std::string storage;
  storage.reserve(pt.text.size() + pt.pieces.size() * 4);
  for (Piece& pc : pt.pieces) {
    size_t start = storage.size();
    f(pt.piece(pc), pc.first, storage);
    pc.off = static_cast<uint32_t>(start);
    pc.len = static_cast<uint32_t>(storage.size() - start);
  }
  pt.storage = std::move(storage);
  pt.text = pt.storage;
}

// Each character satisfying `pred` is one match (HF's `impl Pattern for Fn(char) -> bool`).
template <typename Pred>
auto char_matcher(Pred pred) {
  return [pred](std::string_view s, auto&& fn) {
    for (size_t i = 0; i < s.size();) {
      size_t len;
      uint32_t cp = unicode::decode(s, i, len);
      if (pred(cp)) fn(i, i + len);
      i += len;
    }
  };
}

auto regex_matcher(const Regex& re) {
  return [&re](std::string_view s, auto&& fn) { re.for_each_match(s, fn); };
}

class Sequence : public PreTokenizer {
 public:
  explicit Sequence(std::vector<std::unique_ptr<PreTokenizer>> v) : v_(std::move(v)) {}
  void apply(PreTokenized& pt) const override {
    for (const auto& p : v_) p->apply(pt);
  }

 private:
  std::vector<std::unique_ptr<PreTokenizer>> v_;
};

class Split : public PreTokenizer {
 public:
  Split(Pattern p, Behavior b, bool invert) : p_(std::move(p)), b_(b), invert_(invert) {}
  void apply(PreTokenized& pt) const override {
    split_pieces(pt, b_, invert_, [this](std::string_view s, auto&& fn) { p_.for_each_match(s, fn); });
  }

 private:
  Pattern p_;
  Behavior b_;
  bool invert_;
};

class RegexSplit : public PreTokenizer {
 public:
  RegexSplit(const std::string& re, std::string_view where, Behavior b, bool invert)
      : re_(re, where), b_(b), invert_(invert) {}
  void apply(PreTokenized& pt) const override { split_pieces(pt, b_, invert_, regex_matcher(re_)); }

 private:
  Regex re_;
  Behavior b_;
  bool invert_;
};

const char* kGpt2Pattern = R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";

// The byte->char mapping itself is left to the model (it matches raw bytes); what remains here
// is the optional prefix space and the optional GPT-2 split.
class ByteLevel : public PreTokenizer {
 public:
  ByteLevel(bool add_prefix_space, bool use_regex, const std::string& where) : add_prefix_space_(add_prefix_space) {
    if (use_regex) re_ = std::make_unique<Regex>(kGpt2Pattern, where);
  }
  void apply(PreTokenized& pt) const override {
    if (add_prefix_space_) {
      transform_pieces(pt, [](std::string_view s, bool, std::string& out) {
        if (s.empty() || s[0] != ' ') out += ' ';
        out.append(s);
      });
    }
    if (re_) split_pieces(pt, Behavior::Isolated, false, regex_matcher(*re_));
  }

 private:
  bool add_prefix_space_;
  std::unique_ptr<Regex> re_;
};

enum class PrependScheme { Always, First, Never };

class Metaspace : public PreTokenizer {
 public:
  Metaspace(std::string repl, PrependScheme scheme, bool split) : repl_(std::move(repl)), scheme_(scheme), split_(split) {}
  void apply(PreTokenized& pt) const override {
    transform_pieces(pt, [this](std::string_view s, bool first, std::string& out) {
      bool starts = s.substr(0, 1) == " " || s.substr(0, repl_.size()) == repl_;
      if (!starts && (scheme_ == PrependScheme::Always || (scheme_ == PrependScheme::First && first))) out += repl_;
      for (char c : s) {
        if (c == ' ') out += repl_;
        else out += c;
      }
    });
    if (split_) {
      Pattern p(repl_);
      split_pieces(pt, Behavior::MergedWithNext, false, [&](std::string_view s, auto&& fn) { p.for_each_match(s, fn); });
    }
  }

 private:
  std::string repl_;
  PrependScheme scheme_;
  bool split_;
};

template <typename M>
class MatcherSplit : public PreTokenizer {
 public:
  MatcherSplit(M m, Behavior b, bool invert = false) : m_(std::move(m)), b_(b), invert_(invert) {}
  void apply(PreTokenized& pt) const override { split_pieces(pt, b_, invert_, m_); }

 private:
  M m_;
  Behavior b_;
  bool invert_;
};
template <typename M>
std::unique_ptr<PreTokenizer> make_matcher_split(M m, Behavior b) {
  return std::make_unique<MatcherSplit<M>>(std::move(m), b);
}

// ASCII punctuation (Rust's is_ascii_punctuation includes symbols like $+<=>^`|~) or Unicode P*.
const char* kPunctPattern = R"([\p{P}\x21-\x2F\x3A-\x40\x5B-\x60\x7B-\x7E])";

std::unique_ptr<PreTokenizer> make(const nlohmann::json& j, const std::string& where, bool& byte_level) {
  if (j.is_null()) return nullptr;
  std::string type = json_type(j, where);
  if (byte_level) fail("tokenizer.json: {}: pre-tokenizer {:?} after ByteLevel is not supported", where, type);
  if (type == "Sequence") {
    std::vector<std::unique_ptr<PreTokenizer>> v;
    const auto& arr = json_array(j, "pretokenizers", where);
    for (size_t i = 0; i < arr.size(); ++i)
      if (auto p = make(arr[i], fmt::format("{}.pretokenizers[{}]", where, i), byte_level)) v.push_back(std::move(p));
    return std::make_unique<Sequence>(std::move(v));
  }
  if (type == "Split")
    return std::make_unique<Split>(Pattern(j, where), parse_behavior(j, where, Behavior::Isolated),
                                   json_bool(j, "invert", where, false));
  if (type == "ByteLevel") {
    byte_level = true;
    return std::make_unique<ByteLevel>(json_bool(j, "add_prefix_space", where, true), json_bool(j, "use_regex", where, true),
                                       where);
  }
  if (type == "Metaspace") {
    std::string repl = j.contains("replacement") && j["replacement"].is_string() ? j["replacement"].get<std::string>()
                                                                                  : std::string("\xE2\x96\x81");
    PrependScheme scheme = json_bool(j, "add_prefix_space", where, true) ? PrependScheme::Always : PrependScheme::Never;
    if (j.contains("prepend_scheme") && !j["prepend_scheme"].is_null()) {
      std::string s = json_string(j, "prepend_scheme", where);
      if (s == "always") scheme = PrependScheme::Always;
      else if (s == "first") scheme = PrependScheme::First;
      else if (s == "never") scheme = PrependScheme::Never;
      else fail("tokenizer.json: {}.prepend_scheme {:?} is not always/first/never", where, s);
    }
    return std::make_unique<Metaspace>(repl, scheme, json_bool(j, "split", where, true));
  }
  if (type == "Digits")
    return std::make_unique<RegexSplit>(R"(\p{N})", where,
                                        json_bool(j, "individual_digits", where, false) ? Behavior::Isolated : Behavior::Contiguous,
                                        false);
  if (type == "Whitespace") return std::make_unique<RegexSplit>(R"(\w+|[^\w\s]+)", where, Behavior::Removed, true);
  if (type == "WhitespaceSplit") return make_matcher_split(char_matcher(unicode::is_whitespace), Behavior::Removed);
  if (type == "Punctuation")
    return std::make_unique<RegexSplit>(kPunctPattern, where, parse_behavior(j, where, Behavior::Isolated), false);
  if (type == "CharDelimiterSplit") {
    std::string d = json_string(j, "delimiter", where);
    size_t len = 0;
    uint32_t cp = d.empty() ? unicode::kInvalid : unicode::decode(d, 0, len);
    if (cp == unicode::kInvalid || len != d.size()) fail("tokenizer.json: {}.delimiter must be one character", where);
    return make_matcher_split(char_matcher([cp](uint32_t c) { return c == cp; }), Behavior::Removed);
  }
  if (type == "BertPreTokenizer") {
    std::vector<std::unique_ptr<PreTokenizer>> v;
    v.push_back(make_matcher_split(char_matcher(unicode::is_whitespace), Behavior::Removed));
    v.push_back(std::make_unique<RegexSplit>(kPunctPattern, where, Behavior::Isolated, false));
    return std::make_unique<Sequence>(std::move(v));
  }
  fail("tokenizer.json: {}: pre-tokenizer type {:?} is not supported", where, type);
}

}  // namespace

std::unique_ptr<PreTokenizer> make_pre_tokenizer(const nlohmann::json& j, const std::string& where, bool& byte_level) {
  byte_level = false;
  return make(j, where, byte_level);
}

}  // namespace ts::tok
