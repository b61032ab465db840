// The BPE model of tokenizer.json: word -> ids, exactly as Hugging Face tokenizers does it
// (merge lowest rank first, leftmost on ties; ignore_merges; byte fallback; unk fusing).
#pragma once
#include <cstdint>
#include <memory>
#include <nlohmann/json_fwd.hpp>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

namespace ts::tok {

struct StringHash {
  using is_transparent = void;
  size_t operator()(std::string_view s) const noexcept;
};
using StringMap = std::unordered_map<std::string, int32_t, StringHash, std::equal_to<>>;

// (left id, right id) -> (rank, merged id), open addressing: the merge loop's hot lookup.
class PairMap {
 public:
  void reserve(size_t n);
  void insert(int32_t a, int32_t b, int32_t rank, int32_t id);  // a later duplicate wins
  bool find(int32_t a, int32_t b, int32_t& rank, int32_t& id) const {
    if (slots_.empty()) return false;
    uint64_t key = pack(a, b);
    for (size_t i = hash(key);; i = (i + 1) & mask_) {
      const Slot& s = slots_[i];
      if (s.key == key) {
        rank = s.rank;
        id = s.id;
        return true;
      }
      if (s.key == kEmpty) return false;
    }
  }
  size_t size() const { return size_; }

 private:
  static constexpr uint64_t kEmpty = ~uint64_t{0};
  struct Slot {
    uint64_t key = kEmpty;
    int32_t rank = 0, id = 0;
  };
  static uint64_t pack(int32_t a, int32_t b) {
    return (uint64_t{static_cast<uint32_t>(a)} << 32) | static_cast<uint32_t>(b);
  }
  size_t hash(uint64_t k) const { return static_cast<size_t>((k * 0x9E3779B97F4A7C15ull) >> shift_); }
  std::vector<Slot> slots_;
  size_t mask_ = 0, size_ = 0;
  int shift_ = 64;
};

// Ids index dense tables (id -> token), so an id far past the number of tokens would allocate
// gigabytes: ids must stay below twice the token count plus 1024 (room for the reserved gaps real
// tokenizers have) and below 2^24.
constexpr int64_t kMaxTokenId = int64_t(1) << 24;
inline int64_t max_token_id_bound(size_t tokens) {
  int64_t b = 2 * int64_t(tokens) + 1024;
  return b < kMaxTokenId ? b : kMaxTokenId;
}

class Bpe {
 public:
  // `byte_level`: words arrive as raw bytes and vocab entries are read through the GPT-2
  // byte alphabet (the ByteLevel pre-tokenizer's mapping, applied lazily).
  Bpe(const nlohmann::json& model, bool byte_level);

  // Appends the ids of one pre-tokenized word.
  void encode_word(std::string_view word, std::vector<int32_t>& out) const;

  std::optional<int32_t> token_to_id(std::string_view token) const;
  const std::vector<std::string>& id_to_token() const { return id_to_token_; }  // "" for holes
  int32_t max_id() const { return static_cast<int32_t>(id_to_token_.size()) - 1; }
  bool byte_level() const { return byte_level_; }
  size_t num_merges() const { return merges_.size(); }

 private:
  void initial_symbols(std::string_view word, std::vector<int32_t>& sym) const;
  void merge(std::vector<int32_t>& sym) const;
  void merge_small(std::vector<int32_t>& sym) const;
  void merge_heap(std::vector<int32_t>& sym) const;
  void encode_uncached(std::string_view word, std::vector<int32_t>& out) const;
  int32_t unk_id() const;

  bool byte_level_;
  bool ignore_merges_ = false, byte_fallback_ = false, fuse_unk_ = false;
  std::optional<std::string> unk_token_;
  int32_t unk_id_ = -1;
  std::string prefix_, suffix_;  // continuing_subword_prefix / end_of_word_suffix
  StringMap vocab_;              // token strings as written in the file
  StringMap raw_vocab_;          // byte-level: the same tokens as raw bytes
  std::vector<std::string> id_to_token_;
  PairMap merges_;
  int32_t byte_id_[256];          // byte-level: initial symbol of each byte (-1: not in vocab)
  int32_t ascii_id_[128];         // char mode: single-character tokens, the common case fast
  std::unordered_map<uint32_t, int32_t> char_id_;
  int32_t byte_fallback_id_[256];  // "<0xNN>" tokens (-1: absent)
  // SentencePiece-style vocabularies where no token has "▁" after another character can be
  // cut before each word's "▁": no merge can cross that point, and the pieces become cacheable.
  bool split_on_metaspace_ = false;
  uint64_t serial_;  // identifies this model's entries in the per-thread word caches
};

}  // namespace ts::tok
