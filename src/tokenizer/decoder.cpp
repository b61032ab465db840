#include "tokenizer/decoder.h"

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "tokenizer/byte_level.h"
#include "tokenizer/json_util.h"
#include "tokenizer/regex.h"
#include "tokenizer/unicode.h"

namespace ts::tok {
namespace {

const char* kReplacementChar = "\xEF\xBF\xBD";

class Sequence : public Decoder {
 public:
  explicit Sequence(std::vector<std::unique_ptr<Decoder>> v) : v_(std::move(v)) {}
  void chain(std::vector<std::string>& t) const override {
    for (const auto& d : v_) d->chain(t);
  }

 private:
  std::vector<std::unique_ptr<Decoder>> v_;
};

// Tokens made only of byte-alphabet characters become those bytes, others (added tokens with
// other characters) stay as they are; the whole is then made valid UTF-8 lossily.
class ByteLevel : public Decoder {
 public:
  void chain(std::vector<std::string>& t) const override {
    std::string bytes;
    for (const std::string& tok : t) {
      if (auto raw = byte_level::token_to_bytes(tok)) bytes += *raw;
      else bytes += tok;
    }
    t.assign(1, unicode::to_valid_lossy(bytes));
  }
  bool is_byte_level() const override { return true; }
};

class Replace : public Decoder {
 public:
  Replace(Pattern p, std::string content) : p_(std::move(p)), content_(std::move(content)) {}
  void chain(std::vector<std::string>& t) const override {
    for (std::string& tok : t) tok = p_.replace_all(tok, content_);
  }

 private:
  Pattern p_;
  std::string content_;
};

// Runs of "<0xNN>" tokens become the bytes they name when those form valid UTF-8; otherwise
// each byte becomes U+FFFD (HF's rule, not the lossy maximal-subpart one).
class ByteFallback : public Decoder {
 public:
  void chain(std::vector<std::string>& t) const override {
    std::vector<std::string> out;
    out.reserve(t.size());
    std::string bytes;
    auto flush = [&] {
      if (bytes.empty()) return;
      if (unicode::valid_prefix(bytes) == bytes.size()) {
        out.push_back(bytes);
      } else {
        for (size_t i = 0; i < bytes.size(); ++i) out.emplace_back(kReplacementChar);
      }
      bytes.clear();
    };
    for (std::string& tok : t) {
      int v = byte_token(tok);
      if (v >= 0) {
        bytes.push_back(static_cast<char>(v));
      } else {
        flush();
        out.push_back(std::move(tok));
      }
    }
    flush();
    t = std::move(out);
  }

 private:
  static int hex(char c) {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
  }
  static int byte_token(const std::string& s) {
    if (s.size() != 6 || s.compare(0, 3, "<0x") != 0 || s[5] != '>') return -1;
    int h = hex(s[3]), l = hex(s[4]);
    return h < 0 || l < 0 ? -1 : h * 16 + l;
  }
};

class Fuse : public Decoder {
 public:
  void chain(std::vector<std::string>& t) const override {
    std::string all;
    for (const std::string& tok : t) all += tok;
    t.assign(1, std::move(all));
  }
};

// Removes up to `start` leading and `stop` trailing copies of one character from each token.
class Strip : public Decoder {
 public:
  Strip(std::string content, size_t start, size_t stop) : content_(std::move(content)), start_(start), stop_(stop) {}
  void chain(std::vector<std::string>& t) const override {
    if (content_.empty()) return;
    for (std::string& tok : t) {
      size_t b = 0, e = tok.size();
      for (size_t k = 0; k < start_ && tok.compare(b, content_.size(), content_) == 0 && b + content_.size() <= e; ++k)
        b += content_.size();
      for (size_t k = 0; k < stop_ && e >= b + content_.size() && tok.compare(e - content_.size(), content_.size(), content_) == 0;
           ++k)
        e -= content_.size();
      tok = tok.substr(b, e - b);
    }
  }

 private:
  std::string content_;
  size_t start_, stop_;
};

// The replacement character becomes a space, except in the first token (where HF drops it)
// unless the prepend scheme is "never".
class Metaspace : public Decoder {
 public:
  Metaspace(std::string repl, bool strip_first) : repl_(std::move(repl)), strip_first_(strip_first) {}
  void chain(std::vector<std::string>& t) const override {
    for (size_t i = 0; i < t.size(); ++i) {
      std::string out;
      out.reserve(t[i].size());
      const std::string& s = t[i];
      for (size_t p = 0; p < s.size();) {
        if (s.compare(p, repl_.size(), repl_) == 0) {
          if (!(i == 0 && strip_first_)) out += ' ';
          p += repl_.size();
        } else {
          out += s[p++];
        }
      }
      t[i] = std::move(out);
    }
  }

 private:
  std::string repl_;
  bool strip_first_;
};

// Classic BPE end-of-word suffix: becomes a space, except on the last token.
class BpeDecoder : public Decoder {
 public:
  explicit BpeDecoder(std::string suffix) : suffix_(std::move(suffix)) {}
  void chain(std::vector<std::string>& t) const override {
    Pattern p(suffix_);
    for (size_t i = 0; i < t.size(); ++i) t[i] = p.replace_all(t[i], i + 1 == t.size() ? "" : " ");
  }

 private:
  std::string suffix_;
};

}  // namespace

std::unique_ptr<Decoder> make_decoder(const nlohmann::json& j, const std::string& where) {
  if (j.is_null()) return nullptr;
  std::string type = json_type(j, where);
  if (type == "Sequence") {
    std::vector<std::unique_ptr<Decoder>> v;
    const auto& arr = json_array(j, "decoders", where);
    for (size_t i = 0; i < arr.size(); ++i)
      if (auto d = make_decoder(arr[i], fmt::format("{}.decoders[{}]", where, i))) v.push_back(std::move(d));
    return std::make_unique<Sequence>(std::move(v));
  }
  if (type == "ByteLevel") return std::make_unique<ByteLevel>();
  if (type == "Replace") return std::make_unique<Replace>(Pattern(j, where), json_string(j, "content", where));
  if (type == "ByteFallback") return std::make_unique<ByteFallback>();
  if (type == "Fuse") return std::make_unique<Fuse>();
  if (type == "Strip") {
    std::string content = json_string(j, "content", where);
    return std::make_unique<Strip>(content, static_cast<size_t>(json_int(j, "start", where, 0)),
                                   static_cast<size_t>(json_int(j, "stop", where, 0)));
  }
  if (type == "Metaspace") {
    std::string repl = j.contains("replacement") && j["replacement"].is_string() ? j["replacement"].get<std::string>()
                                                                                  : std::string("\xE2\x96\x81");
    bool strip_first = json_bool(j, "add_prefix_space", where, true);
    if (j.contains("prepend_scheme") && j["prepend_scheme"].is_string())
      strip_first = j["prepend_scheme"].get<std::string>() != "never";
    return std::make_unique<Metaspace>(repl, strip_first);
  }
  if (type == "BPEDecoder") {
    std::string suffix = j.contains("suffix") && j["suffix"].is_string() ? j["suffix"].get<std::string>() : "</w>";
    return std::make_unique<BpeDecoder>(suffix);
  }
  fail("tokenizer.json: {}: decoder type {:?} is not supported", where, type);
}

}  // namespace ts::tok
