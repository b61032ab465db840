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

int drain_steady(Engine& e, int n, int max_tokens, const std::function<void(std::thread::id)>& begin,
                 const std::function<void()>& end) {
  struct Waker : StreamWaker {
    std::mutex mu;
    std::condition_variable cv;
    bool woken = false;
    std::thread::id by;
    void wake() override {
      std::lock_guard<std::mutex> lk(mu);
      woken = true;
      by = std::this_thread::get_id();
      cv.notify_one();
    }
  };
  auto waker = std::make_shared<Waker>();
  auto prompts = code_prompts(e, n);
  std::vector<std::shared_ptr<Stream>> st;
  for (auto& p : prompts) {
    st.push_back(e.submit(greedy(p, max_tokens)));
    st.back()->set_waker(waker, st.size() - 1);
  }
  int finished = 0, failed = 0, phase = 0;
  int64_t received = 0;
  std::vector<uint64_t> tags;
  StreamEvent ev;
  while (finished < n) {
    std::thread::id by;
    {
      std::unique_lock<std::mutex> lk(waker->mu);
      if (!waker->cv.wait_for(lk, std::chrono::seconds(60), [&] { return waker->woken; }))
        throw Error("drain_steady: no output for 60 s");
      waker->woken = false;
      by = waker->by;
    }
    waker->take(tags);
    for (uint64_t i : tags)
      while (st[i]->try_pop(ev)) {
        failed += !ev.error.empty();
        finished += ev.finished;
        received += int64_t(ev.tokens.size());
      }
    if (phase == 0 && received >= int64_t(n) * max_tokens / 4) {
      begin(by);
      phase = 1;
    }
    if (phase == 1 && received >= int64_t(n) * max_tokens * 3 / 4) {
      end();
      phase = 2;
    }
  }
  if (phase != 2) throw Error("drain_steady: the requests ended before three quarters of their tokens");
  return failed;
}

}  // namespace ts::test
