#include "tokenizer/tokenizer.h"

#include <cctype>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "core/error.h"
#include "core/log.h"
#include "io/json_file.h"
#include "tokenizer/bpe.h"
#include "tokenizer/byte_level.h"
#include "tokenizer/decoder.h"
#include "tokenizer/json_util.h"
#include "tokenizer/normalizer.h"
#include "tokenizer/post_processor.h"
#include "tokenizer/pre_tokenizer.h"
#include "tokenizer/unicode.h"

namespace ts::tok {
namespace fs = std::filesystem;

namespace {

constexpr uint8_t kValid = 1, kSpecial = 2;

// Regular files only (a FIFO would block the load forever), bounded in size.
std::string read_file(const std::string& path) { return io::read_regular_file(path); }

// Nesting is checked before parsing; errors name the file, not nlohmann's exception id.
nlohmann::json parse_json(std::string_view text, const std::string& name) {
  return io::parse_json_text(text, name);
}

}  // namespace

Tokenizer::Tokenizer() = default;
Tokenizer::~Tokenizer() = default;

std::shared_ptr<Tokenizer> Tokenizer::from_json_string(std::string_view json, const std::string& name) {
  std::shared_ptr<Tokenizer> t(new Tokenizer());
  t->load_json(json, name);
  return t;
}

std::shared_ptr<Tokenizer> Tokenizer::from_file(const std::string& path) { return from_json_string(read_file(path), path); }

std::shared_ptr<Tokenizer> Tokenizer::from_dir(const std::string& dir) {
  if (!fs::is_directory(dir)) fail("tokenizer: {} is not a directory", dir);
  auto t = from_file((fs::path(dir) / "tokenizer.json").string());
  t->load_config(dir);
  return t;
}

std::shared_ptr<Tokenizer> Tokenizer::load(const std::string& path) {
  if (fs::is_directory(path)) return from_dir(path);
  if (!fs::exists(path)) fail("tokenizer: {} does not exist (expected a model directory or a tokenizer.json)", path);
  return from_file(path);
}

void Tokenizer::load_json(std::string_view text, const std::string& name) {
  nlohmann::json j = parse_json(text, name);
  if (!j.is_object()) fail("{}: the top level must be a JSON object", name);
  auto field = [&](const char* key) -> const nlohmann::json& {
    static const nlohmann::json null;
    return j.contains(key) ? j[key] : null;
  };
  try {
    const auto& m = field("model");
    if (!m.is_object()) fail("tokenizer.json: model must be an object");
    std::string type = m.contains("type") && m["type"].is_string() ? m["type"].get<std::string>() : "BPE";
    if (type != "BPE") fail("tokenizer.json: model.type {:?} is not supported (only BPE)", type);
    if (!field("truncation").is_null()) spdlog::warn("{}: truncation settings ignored (inputs are never truncated)", name);

    bool byte_level = false;
    pre_tokenizer_ = make_pre_tokenizer(field("pre_tokenizer"), "pre_tokenizer", byte_level);
    normalizer_ = make_normalizer(field("normalizer"), "normalizer");
    model_ = std::make_unique<Bpe>(m, byte_level);

    // Added tokens keep the model's id when the model has the content (as HF re-adds them).
    const auto& at = field("added_tokens");
    if (!at.is_null() && !at.is_array()) fail("tokenizer.json: added_tokens must be an array");
    for (size_t i = 0; i < (at.is_array() ? at.size() : 0); ++i) {
      const auto& e = at[i];
      std::string where = fmt::format("added_tokens[{}]", i);
      AddedToken a;
      a.content = json_string(e, "content", where);
      int64_t id = json_int(e, "id", where, -1);
      // Checked before the cast: 2^40 must not wrap to a small id, 1e8 must not size the tables.
      int64_t bound = token_id_limit(size_t(model_->max_id() + 1) + at.size());
      if (id >= bound)
        fail("tokenizer.json: {}.id {} is outside the vocabulary ({} model tokens + {} added; ids must be below {})",
             where, id, model_->max_id() + 1, at.size(), bound);
      a.id = static_cast<int32_t>(id);
      a.special = json_bool(e, "special", where, false);
      a.single_word = json_bool(e, "single_word", where, false);
      a.lstrip = json_bool(e, "lstrip", where, false);
      a.rstrip = json_bool(e, "rstrip", where, false);
      a.normalized = json_bool(e, "normalized", where, !a.special);
      if (auto mid = model_->token_to_id(a.content); mid && *mid != a.id) {
        spdlog::warn("{}: {}: {:?} has id {} in the model vocab; using it instead of {}", name, where, a.content, *mid, a.id);
        a.id = *mid;
      }
      if (a.id < 0) fail("tokenizer.json: {}.id must be a non-negative integer", where);
      added_.push_back(std::move(a));
    }

    int32_t max_id = model_->max_id();
    for (const auto& a : added_) max_id = std::max(max_id, a.id);
    tokens_.assign(static_cast<size_t>(max_id + 1), std::string());
    flags_.assign(tokens_.size(), 0);
    const auto& mt = model_->id_to_token();
    for (size_t id = 0; id < mt.size(); ++id) {
      tokens_[id] = mt[id];
      if (!mt[id].empty()) flags_[id] = kValid;
    }
    for (const auto& a : added_) {
      added_index_.emplace(a.content, a.id);
      tokens_[a.id] = a.content;
      flags_[a.id] = kValid | (a.special ? kSpecial : 0);
    }

    raw_matcher_ = std::make_unique<AddedMatcher>();
    normalized_matcher_ = std::make_unique<AddedMatcher>();
    for (const auto& a : added_) {
      if (!a.normalized) {
        raw_matcher_->add(a.content, &a);
      } else {
        std::string pattern = a.content;
        if (normalizer_) normalizer_->normalize(pattern);
        normalized_matcher_->add(pattern, &a);
      }
    }

    post_processor_ = make_post_processor(field("post_processor"), "post_processor",
                                          [this](std::string_view t) { return token_to_id(t); });
    if (post_processor_) {  // the ids it adds must be in the vocabulary (checked here, not at encode)
      std::vector<int32_t> extra;
      post_processor_->apply(extra);
      for (int32_t id : extra)
        if (id < 0 || size_t(id) >= flags_.size() || !(flags_[id] & kValid))
          fail("tokenizer.json: post_processor adds token id {}, which is not in the vocabulary", id);
    }
    decoder_ = make_decoder(field("decoder"), "decoder");
    byte_decode_ = decoder_ && decoder_->is_byte_level();
    if (byte_decode_) {
      token_bytes_.resize(tokens_.size());
      for (size_t id = 0; id < tokens_.size(); ++id) {
        auto raw = byte_level::token_to_bytes(tokens_[id]);
        token_bytes_[id] = raw ? *raw : tokens_[id];
      }
    }
  } catch (const Error& e) {
    // Messages from the parts name the field; prefix the file unless they already do.
    std::string msg = e.what();
    if (msg.rfind("tokenizer.json: ", 0) == 0) msg = msg.substr(16);
    if (msg.rfind(name, 0) == 0) throw;
    throw Error(fmt::format("{}: {}", name, msg));
  } catch (const nlohmann::json::exception& e) {
    fail("{}: unexpected JSON content: {}", name, io::json_error_text(e));
  }
}

void Tokenizer::load_config(const std::string& dir) {
  fs::path cfg_path = fs::path(dir) / "tokenizer_config.json";
  if (fs::exists(cfg_path)) {
    std::string name = cfg_path.string();
    nlohmann::json c = parse_json(read_file(name), name);
    if (!c.is_object()) fail("{}: the top level must be a JSON object", name);
    auto token_string = [&](const char* key) -> std::string {
      if (!c.contains(key) || c[key].is_null()) return "";
      const auto& v = c[key];
      if (v.is_string()) return v.get<std::string>();
      if (v.is_object() && v.contains("content") && v["content"].is_string()) return v["content"].get<std::string>();
      fail("{}: {} must be a string or an object with \"content\"", name, key);
    };
    auto opt_bool = [&](const char* key) -> std::optional<bool> {
      if (!c.contains(key) || c[key].is_null()) return std::nullopt;
      if (!c[key].is_boolean()) fail("{}: {} must be a boolean", name, key);
      return c[key].get<bool>();
    };
    bos_token_ = token_string("bos_token");
    eos_token_ = token_string("eos_token");
    add_bos_token_ = opt_bool("add_bos_token");
    add_eos_token_ = opt_bool("add_eos_token");
    clean_up_tokenization_spaces_ = opt_bool("clean_up_tokenization_spaces");
    if (c.contains("chat_template") && !c["chat_template"].is_null()) {
      const auto& ct = c["chat_template"];
      if (ct.is_string()) {
        chat_templates_.emplace_back("default", ct.get<std::string>());
      } else if (ct.is_array()) {
        for (size_t i = 0; i < ct.size(); ++i) {
          const auto& e = ct[i];
          if (!e.is_object() || !e.contains("name") || !e["name"].is_string() || !e.contains("template") ||
              !e["template"].is_string())
            fail("{}: chat_template[{}] must be {{\"name\": string, \"template\": string}}", name, i);
          chat_templates_.emplace_back(e["name"].get<std::string>(), e["template"].get<std::string>());
        }
      } else {
        fail("{}: chat_template must be a string or a list of {{name, template}}", name);
      }
    }
  }
  // Newer transformers save the default template as its own file; it wins over the config's.
  fs::path jinja = fs::path(dir) / "chat_template.jinja";
  if (fs::exists(jinja)) {
    std::string t = read_file(jinja.string());
    std::erase_if(chat_templates_, [](const auto& p) { return p.first == "default"; });
    chat_templates_.insert(chat_templates_.begin(), {"default", std::move(t)});
  }
  if (!bos_token_.empty() && !token_to_id(bos_token_))
    spdlog::warn("{}: bos_token {:?} is not in the vocabulary", dir, bos_token_);
  if (!eos_token_.empty() && !token_to_id(eos_token_))
    spdlog::warn("{}: eos_token {:?} is not in the vocabulary", dir, eos_token_);
}

std::optional<std::string> Tokenizer::chat_template(std::string_view name) const {
  for (const auto& [n, t] : chat_templates_)
    if (n == name) return t;
  return std::nullopt;
}

std::vector<int32_t> Tokenizer::encode(std::string_view text, bool add_special_tokens) const {
  std::vector<int32_t> ids;
  ids.reserve(text.size() / 3 + 4);
  if (raw_matcher_->empty()) {
    encode_segment(text, true, ids);
  } else {
    raw_matcher_->split(text, [&](size_t b, size_t e, const AddedToken* t) {
      if (t) ids.push_back(t->id);
      else encode_segment(text.substr(b, e - b), b == 0, ids);
    });
  }
  if (add_special_tokens && post_processor_) post_processor_->apply(ids);
  return ids;
}

// Text between raw-matched added tokens: normalize, then cut out normalized added tokens.
void Tokenizer::encode_segment(std::string_view text, bool first, std::vector<int32_t>& ids) const {
  std::string normalized;
  if (normalizer_) {
    normalized.assign(text);
    normalizer_->normalize(normalized);
    text = normalized;
  }
  if (normalized_matcher_->empty()) return model_encode(text, first, ids);
  normalized_matcher_->split(text, [&](size_t b, size_t e, const AddedToken* t) {
    if (t) ids.push_back(t->id);
    else model_encode(text.substr(b, e - b), first && b == 0, ids);
  });
}

void Tokenizer::model_encode(std::string_view text, bool first, std::vector<int32_t>& ids) const {
  if (text.empty()) return;
  if (!pre_tokenizer_) return model_->encode_word(text, ids);
  PreTokenized pt;
  pt.text = text;
  pt.pieces.push_back({0, static_cast<uint32_t>(text.size()), first});
  pre_tokenizer_->apply(pt);
  for (const Piece& p : pt.pieces) model_->encode_word(pt.piece(p), ids);
}

std::string Tokenizer::decode(const std::vector<int32_t>& ids, bool skip_special_tokens) const {
  return decode(ids.data(), ids.size(), skip_special_tokens);
}

std::string Tokenizer::decode(const int32_t* ids, size_t n, bool skip_special_tokens) const {
  // An id the tokenizer has no token for decodes to nothing, as HF tokenizers' decode skips it:
  // checkpoints pad the LM head past the tokenizer (Qwen2.5: 152,064 rows, 151,665 tokens; the
  // llama3 fixture: 1,088 vs 1,024) and a model can sample those rows. Negative ids are a
  // caller's bug.
  for (size_t i = 0; i < n; ++i)
    if (ids[i] < 0) fail("token id {} is not in the vocabulary (size {})", ids[i], vocab_size());
  auto skipped = [&](int32_t id) {
    return !is_valid_id(id) || (skip_special_tokens && (flags_[id] & kSpecial));
  };
  if (byte_decode_) {
    std::string bytes;
    for (size_t i = 0; i < n; ++i)
      if (!skipped(ids[i])) bytes += token_bytes_[ids[i]];
    return unicode::to_valid_lossy(bytes);
  }
  std::vector<std::string> toks;
  toks.reserve(n);
  for (size_t i = 0; i < n; ++i)
    if (!skipped(ids[i])) toks.push_back(tokens_[ids[i]]);
  std::string out;
  if (decoder_) {
    decoder_->chain(toks);
    for (const auto& t : toks) out += t;
  } else {
    for (size_t i = 0; i < toks.size(); ++i) out += (i ? " " : "") + toks[i];
  }
  return out;
}

int32_t Tokenizer::vocab_size() const { return static_cast<int32_t>(tokens_.size()); }

bool Tokenizer::is_valid_id(int32_t id) const { return id >= 0 && id < vocab_size() && (flags_[id] & kValid); }

std::optional<int32_t> Tokenizer::token_to_id(std::string_view tok) const {
  auto it = added_index_.find(tok);
  if (it != added_index_.end()) return it->second;
  return model_->token_to_id(tok);
}

void Tokenizer::check_id(int32_t id) const {
  if (!is_valid_id(id)) fail("token id {} is not in the vocabulary (size {})", id, vocab_size());
}

std::string Tokenizer::id_to_token(int32_t id) const {
  check_id(id);
  return tokens_[id];
}

std::string Tokenizer::token_bytes(int32_t id) const {
  if (!is_valid_id(id)) return "";
  if (byte_decode_) return token_bytes_[id];
  const std::string& t = tokens_[id];
  auto hex = [](char c) { return std::isxdigit(static_cast<unsigned char>(c)) != 0; };
  if (t.size() == 6 && t.compare(0, 3, "<0x") == 0 && hex(t[3]) && hex(t[4]) && t[5] == '>')
    return std::string(1, static_cast<char>(std::stoi(t.substr(3, 2), nullptr, 16)));
  if (!decoder_ || (flags_[id] & kSpecial)) return t;
  std::vector<std::string> toks = {"\x01", t};
  decoder_->chain(toks);
  std::string out;
  for (const auto& s : toks) out += s;
  return out.rfind('\x01', 0) == 0 ? out.substr(1) : out;
}

bool Tokenizer::is_special(int32_t id) const { return is_valid_id(id) && (flags_[id] & kSpecial); }

std::optional<int32_t> Tokenizer::bos_id() const {
  return bos_token_.empty() ? std::nullopt : token_to_id(bos_token_);
}

std::optional<int32_t> Tokenizer::eos_id() const {
  return eos_token_.empty() ? std::nullopt : token_to_id(eos_token_);
}

}  // namespace ts::tok
