#include "engine_test_util.h"

#include "tokenizer/tokenizer.h"

namespace ts::test {

std::vector<std::vector<int32_t>> code_prompts(const Engine& e, int n) {
  static const char* parts[] = {
      "def fibonacci(n):\n", "import os\nimport sys\n\n", "class Stack:\n    def __init__(self):\n        self.items = []\n",
      "for i in range(10):\n    print(i)\n", "def read_file(path):\n    with open(path) as f:\n        return f.read()\n",
      "# compute the mean of a list\n", "    if x > 0:\n        return x\n    else:\n        return -x\n",
      "def quicksort(xs):\n    if len(xs) <= 1:\n        return xs\n", "result = {k: v for k, v in items}\n"};
  std::vector<std::vector<int32_t>> out;
  for (int i = 0; i < n; ++i) {
    std::string text;
    for (int j = 0; j <= i % 7; ++j) text += parts[(i * 3 + j) % 9];
    out.push_back(e.tokenizer().encode(text, true));
  }
  return out;
}

}  // namespace ts::test
