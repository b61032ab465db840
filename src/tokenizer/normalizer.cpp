#include "tokenizer/normalizer.h"

#include <nlohmann/json.hpp>
#include <vector>

#include "core/error.h"
#include "tokenizer/json_util.h"
#include "tokenizer/regex.h"
#include "tokenizer/unicode.h"

namespace ts::tok {
namespace {

class Sequence : public Normalizer {
 public:
  explicit Sequence(std::vector<std::unique_ptr<Normalizer>> v) : v_(std::move(v)) {}
  void normalize(std::string& s) const override {
    for (const auto& n : v_) n->normalize(s);
  }

 private:
  std::vector<std::unique_ptr<Normalizer>> v_;
};

class UnicodeForm : public Normalizer {
 public:
  explicit UnicodeForm(unicode::Form f) : f_(f) {}
  void normalize(std::string& s) const override { s = unicode::normalize(s, f_); }

 private:
  unicode::Form f_;
};

class Lowercase : public Normalizer {
 public:
  void normalize(std::string& s) const override { s = unicode::lowercase(s); }
};

class Prepend : public Normalizer {
 public:
  explicit Prepend(std::string p) : p_(std::move(p)) {}
  // HF prepends only to non-empty text: "" stays "" (so an empty input encodes to nothing).
  void normalize(std::string& s) const override {
    if (!s.empty()) s.insert(0, p_);
  }

 private:
  std::string p_;
};

class Replace : public Normalizer {
 public:
  Replace(Pattern p, std::string content) : p_(std::move(p)), content_(std::move(content)) {}
  void normalize(std::string& s) const override { s = p_.replace_all(s, content_); }

 private:
  Pattern p_;
  std::string content_;
};

class Strip : public Normalizer {
 public:
  Strip(bool left, bool right) : left_(left), right_(right) {}
  void normalize(std::string& s) const override {
    size_t b = 0, e = s.size();
    if (left_) {
      while (b < e) {
        size_t len;
        uint32_t cp = unicode::decode(s, b, len);
        if (!unicode::is_whitespace(cp)) break;
        b += len;
      }
    }
    if (right_) {
      while (e > b) {
        size_t start = e - 1;
        while (start > b && (static_cast<unsigned char>(s[start]) & 0xC0) == 0x80) --start;
        size_t len;
        uint32_t cp = unicode::decode(s, start, len);
        if (start + len != e || !unicode::is_whitespace(cp)) break;
        e = start;
      }
    }
    s = s.substr(b, e - b);
  }

 private:
  bool left_, right_;
};

class StripAccents : public Normalizer {
 public:
  void normalize(std::string& s) const override {
    std::string out;
    out.reserve(s.size());
    for (size_t i = 0; i < s.size();) {
      size_t len;
      uint32_t cp = unicode::decode(s, i, len);
      if (!unicode::is_nonspacing_mark(cp)) out.append(s, i, len);
      i += len;
    }
    s = std::move(out);
  }
};

}  // namespace

std::unique_ptr<Normalizer> make_normalizer(const nlohmann::json& j, const std::string& where) {
  if (j.is_null()) return nullptr;
  std::string type = json_type(j, where);
  if (type == "Sequence") {
    std::vector<std::unique_ptr<Normalizer>> v;
    const auto& arr = json_array(j, "normalizers", where);
    for (size_t i = 0; i < arr.size(); ++i)
      if (auto n = make_normalizer(arr[i], fmt::format("{}.normalizers[{}]", where, i))) v.push_back(std::move(n));
    return std::make_unique<Sequence>(std::move(v));
  }
  if (type == "NFC") return std::make_unique<UnicodeForm>(unicode::Form::NFC);
  if (type == "NFD") return std::make_unique<UnicodeForm>(unicode::Form::NFD);
  if (type == "NFKC") return std::make_unique<UnicodeForm>(unicode::Form::NFKC);
  if (type == "NFKD") return std::make_unique<UnicodeForm>(unicode::Form::NFKD);
  if (type == "Lowercase") return std::make_unique<Lowercase>();
  if (type == "StripAccents") return std::make_unique<StripAccents>();
  if (type == "Prepend") return std::make_unique<Prepend>(json_string(j, "prepend", where));
  if (type == "Replace")
    return std::make_unique<Replace>(Pattern(j, where), json_string(j, "content", where));
  if (type == "Strip")
    return std::make_unique<Strip>(json_bool(j, "strip_left", where, true), json_bool(j, "strip_right", where, true));
  fail("tokenizer.json: {}: normalizer type {:?} is not supported", where, type);
}

}  // namespace ts::tok
