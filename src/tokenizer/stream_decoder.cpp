// Streaming detokenization by re-decoding a short window, as HF's DecodeStream does: decoders
// are not streamable one token at a time (ByteLevel/ByteFallback need whole UTF-8 sequences,
// Strip and Metaspace treat the first token specially), but a window that starts on a token
// whose text was already emitted decodes consistently: the new text is the part past the
// window's already-emitted prefix.
#include "core/error.h"
#include "tokenizer/tokenizer.h"
#include "tokenizer/unicode.h"

namespace ts::tok {
namespace {

bool ends_with_replacement(const std::string& s) {
  return s.size() >= 3 && s.compare(s.size() - 3, 3, "\xEF\xBF\xBD") == 0;
}

}  // namespace

StreamDecoder::StreamDecoder(const Tokenizer& tok, bool skip_special) : tok_(tok), skip_special_(skip_special) {}

std::string StreamDecoder::emit(const std::string& text) {
  std::string delta;
  if (text.compare(0, prefix_text_.size(), prefix_text_) == 0) {
    delta = text.substr(prefix_text_.size());
  } else {
    // The window no longer decodes to what was emitted: only an invalid byte run does this
    // (ByteFallback then replaces every byte of the run). Emit the new tokens on their own.
    delta = tok_.decode(ids_.data() + read_, ids_.size() - read_, skip_special_);
  }
  // Slide the window: it now starts at the first token of this emission.
  size_t emitted = read_;
  ids_.erase(ids_.begin(), ids_.begin() + static_cast<std::ptrdiff_t>(emitted));
  read_ = ids_.size();
  prefix_text_ = tok_.decode(ids_.data(), read_, skip_special_);
  return delta;
}

std::string StreamDecoder::push(int32_t id) {
  if (id < 0) fail("token id {} is not in the vocabulary (size {})", id, tok_.vocab_size());
  // A padded LM-head row the tokenizer has no token for adds no text (Tokenizer::decode).
  if (!tok_.is_valid_id(id) || (skip_special_ && tok_.is_special(id))) return "";
  ids_.push_back(id);
  std::string text = tok_.decode(ids_.data(), ids_.size(), skip_special_);
  // A trailing U+FFFD is (almost always) a character whose remaining bytes are still to come.
  if (text.size() <= prefix_text_.size() || ends_with_replacement(text)) return "";
  return emit(text);
}

std::string StreamDecoder::flush() {
  if (read_ == ids_.size()) return "";
  std::string text = tok_.decode(ids_.data(), ids_.size(), skip_special_);
  if (text.size() <= prefix_text_.size() && text.compare(0, prefix_text_.size(), prefix_text_) == 0) {
    read_ = ids_.size();  // the pending tokens add no text
    return "";
  }
  return emit(text);
}

}  // namespace ts::tok
