// Hugging Face tokenizer.json, exact and fast: BPE (byte-level, or SentencePiece-style with
// byte fallback), added/special tokens, normalizers, pre-tokenizers, post-processor, decoders.
// Also reads tokenizer_config.json (bos/eos, add_bos_token, chat templates).
//
// Thread-safety: a loaded Tokenizer is immutable; encode/decode may run on many threads at once
// (word caches and regex scratch are per thread).
#pragma once
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "tokenizer/added_vocab.h"
#include "tokenizer/bpe.h"

namespace ts::tok {

class Normalizer;
class PreTokenizer;
class PostProcessor;
class Decoder;
class AddedMatcher;

class Tokenizer {
 public:
  // dir/tokenizer.json, plus dir/tokenizer_config.json and dir/chat_template.jinja if present.
  static std::shared_ptr<Tokenizer> from_dir(const std::string& dir);
  static std::shared_ptr<Tokenizer> from_file(const std::string& tokenizer_json);
  // A directory (from_dir) or a tokenizer.json path (from_file).
  static std::shared_ptr<Tokenizer> load(const std::string& path);
  // Parses tokenizer.json text; `name` is used in error messages.
  static std::shared_ptr<Tokenizer> from_json_string(std::string_view json, const std::string& name = "tokenizer.json");

  ~Tokenizer();
  Tokenizer(const Tokenizer&) = delete;
  Tokenizer& operator=(const Tokenizer&) = delete;

  // Added tokens in the text are always recognized; add_special_tokens applies the
  // post-processor (e.g. the BOS of TemplateProcessing).
  std::vector<int32_t> encode(std::string_view text, bool add_special_tokens = false) const;
  // Ids without a token (a padded LM head's rows) add no text, as in HF tokenizers; throws
  // ts::Error on a negative id.
  std::string decode(const std::vector<int32_t>& ids, bool skip_special_tokens = false) const;
  std::string decode(const int32_t* ids, size_t n, bool skip_special_tokens = false) const;

  int32_t vocab_size() const;  // max id + 1, added tokens included
  std::optional<int32_t> token_to_id(std::string_view tok) const;
  std::string id_to_token(int32_t id) const;  // throws on an id not in the vocabulary
  bool is_valid_id(int32_t id) const;
  void check_id(int32_t id) const;  // throws ts::Error naming the id unless is_valid_id(id)
  bool is_special(int32_t id) const;
  // The raw bytes this id contributes to a decoded text, for grammar masks: ByteLevel tokens through
  // the byte table, byte-fallback `<0xHH>` tokens as that one byte, others through the decoder with a
  // sentinel first token (so start-only steps such as Strip/Metaspace do not apply). "" for invalid ids.
  std::string token_bytes(int32_t id) const;
  const std::vector<AddedToken>& added_tokens() const { return added_; }

  // From tokenizer_config.json (nullopt / "" when absent).
  std::optional<int32_t> bos_id() const;
  std::optional<int32_t> eos_id() const;
  std::string bos_token() const { return bos_token_; }
  std::string eos_token() const { return eos_token_; }
  std::optional<bool> add_bos_token() const { return add_bos_token_; }
  std::optional<bool> add_eos_token() const { return add_eos_token_; }
  // transformers applies this clean-up in decode(); the tokenizer itself never does (as HF
  // tokenizers), callers that want transformers' text can use it.
  std::optional<bool> clean_up_tokenization_spaces() const { return clean_up_tokenization_spaces_; }
  // (name, template); a plain-string template (or chat_template.jinja) is named "default".
  const std::vector<std::pair<std::string, std::string>>& chat_templates() const { return chat_templates_; }
  std::optional<std::string> chat_template(std::string_view name = "default") const;

 private:
  Tokenizer();
  void load_json(std::string_view json, const std::string& name);
  void load_config(const std::string& dir);
  void encode_segment(std::string_view text, bool first, std::vector<int32_t>& ids) const;
  void model_encode(std::string_view text, bool first, std::vector<int32_t>& ids) const;

  std::unique_ptr<Bpe> model_;
  std::unique_ptr<Normalizer> normalizer_;
  std::unique_ptr<PreTokenizer> pre_tokenizer_;
  std::unique_ptr<PostProcessor> post_processor_;
  std::unique_ptr<Decoder> decoder_;
  std::vector<AddedToken> added_;
  StringMap added_index_;  // content -> id
  std::unique_ptr<AddedMatcher> raw_matcher_, normalized_matcher_;
  std::vector<std::string> tokens_;       // id -> token string (added tokens' content win)
  std::vector<std::string> token_bytes_;  // id -> bytes, for a lone ByteLevel decoder
  std::vector<uint8_t> flags_;            // id -> kValid | kSpecial
  bool byte_decode_ = false;

  std::string bos_token_, eos_token_;
  std::optional<bool> add_bos_token_, add_eos_token_, clean_up_tokenization_spaces_;
  std::vector<std::pair<std::string, std::string>> chat_templates_;
};

// Incremental detokenizer for streaming: push ids one at a time and get the new text. A delta
// never ends inside a UTF-8 character (incomplete bytes are held back until they complete),
// and the concatenation of all deltas plus flush() equals decode(all ids, skip_special) --
// except after invalid UTF-8 in a byte-fallback run, which a full decode turns into U+FFFDs
// from the start of the run, including characters that were already streamed.
class StreamDecoder {
 public:
  explicit StreamDecoder(const Tokenizer& tok, bool skip_special = true);
  std::string push(int32_t id);
  // Whatever is still held back (e.g. an incomplete character at the end), made valid.
  std::string flush();

 private:
  std::string emit(const std::string& text);
  const Tokenizer& tok_;
  bool skip_special_;
  std::vector<int32_t> ids_;  // a window: the text of ids_[0..read_) was already emitted
  size_t read_ = 0;
  std::string prefix_text_;  // decode(ids_[0..read_))
};

}  // namespace ts::tok
