// Added tokens (special or not) are cut out of the text before the model sees it, leftmost
// match first and the longest one at that position, as HF tokenizers' Aho-Corasick does.
#pragma once
#include <array>
#include <cstdint>
#include <functional>
#include <string>
#include <string_view>
#include <vector>

namespace ts::tok {

struct AddedToken {
  int32_t id = -1;
  std::string content;
  bool single_word = false, lstrip = false, rstrip = false, normalized = false, special = false;
};

class AddedMatcher {
 public:
  // `pattern` is what is searched for (the content, normalized for normalized tokens).
  void add(std::string_view pattern, const AddedToken* tok);
  bool empty() const { return nodes_.size() <= 1; }

  // Splits `text`: fn(begin, end, token) per piece, token == nullptr for plain text.
  void split(std::string_view text, const std::function<void(size_t, size_t, const AddedToken*)>& fn) const;

 private:
  struct Node {
    std::vector<std::pair<uint8_t, int32_t>> next;
    const AddedToken* tok = nullptr;
  };
  const AddedToken* longest_at(std::string_view text, size_t pos, size_t& len) const;
  std::vector<Node> nodes_{1};
  std::array<bool, 256> first_byte_{};
};

}  // namespace ts::tok
