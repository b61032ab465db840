#include "tokenizer/post_processor.h"

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "tokenizer/json_util.h"

namespace ts::tok {
namespace {

class Sequence : public PostProcessor {
 public:
  explicit Sequence(std::vector<std::unique_ptr<PostProcessor>> v) : v_(std::move(v)) {}
  void apply(std::vector<int32_t>& ids) const override {
    for (const auto& p : v_) p->apply(ids);
  }

 private:
  std::vector<std::unique_ptr<PostProcessor>> v_;
};

// The single-sequence template as a list of pieces: fixed ids, or the encoded sequence (empty).
class Template : public PostProcessor {
 public:
  explicit Template(std::vector<std::optional<std::vector<int32_t>>> pieces) : pieces_(std::move(pieces)) {}
  void apply(std::vector<int32_t>& ids) const override {
    std::vector<int32_t> out;
    out.reserve(ids.size() + 4);
    for (const auto& p : pieces_) {
      if (p) out.insert(out.end(), p->begin(), p->end());
      else out.insert(out.end(), ids.begin(), ids.end());
    }
    ids = std::move(out);
  }

 private:
  std::vector<std::optional<std::vector<int32_t>>> pieces_;
};

class Identity : public PostProcessor {  // ByteLevel: only adjusts offsets, which we do not return
 public:
  void apply(std::vector<int32_t>&) const override {}
};

using Lookup = std::function<std::optional<int32_t>(std::string_view)>;

std::unique_ptr<PostProcessor> make_template(const nlohmann::json& j, const std::string& where, const Lookup& lookup) {
  if (!j.contains("single")) fail("tokenizer.json: {}.single is missing", where);
  // special_tokens: {"<s>": {"id": "<s>", "ids": [1], "tokens": ["<s>"]}}
  auto special_ids = [&](const std::string& name) {
    if (j.contains("special_tokens") && j["special_tokens"].is_object() && j["special_tokens"].contains(name)) {
      const auto& st = j["special_tokens"][name];
      if (!st.contains("ids") || !st["ids"].is_array()) fail("tokenizer.json: {}.special_tokens[{:?}].ids must be an array", where, name);
      std::vector<int32_t> ids;
      for (size_t i = 0; i < st["ids"].size(); ++i)
        ids.push_back(json_token_id(st["ids"][i], fmt::format("{}.special_tokens[{:?}].ids[{}]", where, name, i)));
      return ids;
    }
    if (auto id = lookup(name)) return std::vector<int32_t>{*id};
    fail("tokenizer.json: {}: special token {:?} of the template is not defined", where, name);
  };
  std::vector<std::optional<std::vector<int32_t>>> pieces;
  const auto& single = j["single"];
  if (single.is_array()) {
    for (size_t i = 0; i < single.size(); ++i) {
      const auto& p = single[i];
      if (p.contains("SpecialToken") && p["SpecialToken"].contains("id") && p["SpecialToken"]["id"].is_string()) {
        pieces.emplace_back(special_ids(p["SpecialToken"]["id"].get<std::string>()));
      } else if (p.contains("Sequence")) {
        pieces.emplace_back(std::nullopt);
      } else {
        fail("tokenizer.json: {}.single[{}] must be a SpecialToken or a Sequence", where, i);
      }
    }
  } else if (single.is_string()) {  // "<s> $A" (the form accepted when building processors)
    std::string s = single.get<std::string>();
    size_t i = 0;
    while (i < s.size()) {
      size_t e = s.find(' ', i);
      if (e == std::string::npos) e = s.size();
      std::string piece = s.substr(i, e - i);
      i = e + 1;
      if (piece.empty()) continue;
      if (piece[0] == '$') {
        pieces.emplace_back(std::nullopt);
      } else {
        size_t colon = piece.rfind(':');
        if (colon != std::string::npos && colon > 0) piece = piece.substr(0, colon);
        pieces.emplace_back(special_ids(piece));
      }
    }
  } else {
    fail("tokenizer.json: {}.single must be an array or a string", where);
  }
  return std::make_unique<Template>(std::move(pieces));
}

// RobertaProcessing / BertProcessing: {"cls": ["<s>", 0], "sep": ["</s>", 2]} -> cls A sep.
std::unique_ptr<PostProcessor> make_cls_sep(const nlohmann::json& j, const std::string& where) {
  auto id_of = [&](const char* key) {
    if (!j.contains(key) || !j[key].is_array() || j[key].size() != 2 || !j[key][1].is_number_integer())
      fail("tokenizer.json: {}.{} must be [token, id]", where, key);
    return json_token_id(j[key][1], fmt::format("{}.{}[1]", where, key));
  };
  std::vector<std::optional<std::vector<int32_t>>> pieces;
  pieces.emplace_back(std::vector<int32_t>{id_of("cls")});
  pieces.emplace_back(std::nullopt);
  pieces.emplace_back(std::vector<int32_t>{id_of("sep")});
  return std::make_unique<Template>(std::move(pieces));
}

}  // namespace

std::unique_ptr<PostProcessor> make_post_processor(const nlohmann::json& j, const std::string& where, const Lookup& lookup) {
  if (j.is_null()) return nullptr;
  std::string type = json_type(j, where);
  if (type == "Sequence") {
    std::vector<std::unique_ptr<PostProcessor>> v;
    const auto& arr = json_array(j, "processors", where);
    for (size_t i = 0; i < arr.size(); ++i)
      if (auto p = make_post_processor(arr[i], fmt::format("{}.processors[{}]", where, i), lookup)) v.push_back(std::move(p));
    return std::make_unique<Sequence>(std::move(v));
  }
  if (type == "TemplateProcessing") return make_template(j, where, lookup);
  if (type == "ByteLevel") return std::make_unique<Identity>();
  if (type == "RobertaProcessing" || type == "BertProcessing") return make_cls_sep(j, where);
  fail("tokenizer.json: {}: post-processor type {:?} is not supported", where, type);
}

}  // namespace ts::tok
