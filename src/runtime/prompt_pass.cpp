#include "runtime/prompt_pass.h"

#include <algorithm>
#include <cmath>

#include "core/error.h"
#include "runtime/kv_cache.h"
#include "runtime/kv_store.h"
#include "runtime/model_runner.h"

namespace ts {

namespace {
// log-softmax of one logits row [V] at `target`, plus the top-k (id, logprob), best first.
TokenLogprob row_logprob(const float* row, int64_t vocab, int32_t target, int k, int32_t& rank) {
  rank = 1;
  for (int64_t v = 0; v < vocab; ++v) rank += row[v] > row[target];
  float mx = -INFINITY;
  for (int64_t v = 0; v < vocab; ++v) mx = std::max(mx, row[v]);
  double sum = 0;
  for (int64_t v = 0; v < vocab; ++v) sum += std::exp(double(row[v] - mx));
  const float lse = mx + float(std::log(sum));
  TokenLogprob lp{target, row[target] - lse, {}};
  if (k > 0) {
    std::vector<int32_t> idx(static_cast<size_t>(vocab));
    for (int64_t v = 0; v < vocab; ++v) idx[size_t(v)] = int32_t(v);
    const auto kk = std::min<int64_t>(k, vocab);
    std::partial_sort(idx.begin(), idx.begin() + kk, idx.end(), [&](int32_t a, int32_t b) { return row[a] > row[b]; });
    for (int64_t i = 0; i < kk; ++i) lp.top.emplace_back(idx[size_t(i)], row[idx[size_t(i)]] - lse);
  }
  return lp;
}
}  // namespace

PromptPassResult run_prompt_pass(ModelRunner& runner, KvCache& kv, const PromptPassRequest& req, int max_chunk) {
  PromptPassResult out;
  const auto n = int64_t(req.ids.size());
  TS_CHECK(n > 0, "prompt pass: empty prompt");
  const auto& model = runner.model();
  if (req.hidden) {
    int slot = model.capture_slot(int(model.config().num_layers));
    if (slot < 0 || model.capture_layers().size() != 1) {
      out.error = "embeddings need the final hidden states, which this engine does not capture (speculative decoding "
                  "or a model without the capture hook)";
      return out;
    }
  }
  std::vector<int32_t> table;
  std::vector<uint64_t> hashes;
  // With a host tier, taking blocks may evict cached ones whose write-back must run before the
  // pass overwrites them (the same plan boundary the scheduler keeps). With a window release
  // (every layer slides) the blocks are taken chunk by chunk and those below the window given
  // back, so a prompt longer than the pool passes; else all at once, before the first chunk.
  const int chunk = std::max(1, max_chunk);
  const bool sliding = kv.window_release() > 0;
  auto take = [&](int64_t upto) {
    kv.begin_plan();
    const bool ok = kv.ensure(table, upto);
    KvBlockOps ops;
    kv.take_ops(ops);
    if (kv.store() && !ops.empty()) kv.store()->execute(ops);
    if (!ok) {
      kv.release(table, hashes);
      out.error = fmt::format("the KV cache has no room for a {}-token pass now; retry later", n);
    }
    return ok;
  };
  if (!take(sliding ? std::min<int64_t>(chunk, n) : n)) return out;
  std::shared_ptr<const int> state;
  if (runner.has_state()) {
    state = runner.take_state_slot();
    if (!state) {
      kv.release(table, hashes);
      out.error = "no recurrent-state slot is free now; retry later";
      return out;
    }
  }
  try {
    const int64_t hdim = model.config().hidden_size;
    if (req.hidden) out.hidden.assign(size_t(hdim), 0.0f);
    for (int64_t start = 0; start < n; start += chunk) {
      const int len = int(std::min<int64_t>(chunk, n - start));
      const bool last = start + len == n;
      if (sliding && start > 0) {
        kv.release_below_window(table, start);
        if (!take(start + len)) {
          out.logprobs.clear();
          out.ranks.clear();
          out.hidden.clear();
          return out;
        }
      }
      SeqChunk c;
      c.tokens = req.ids.data() + start;
      c.num_tokens = len;
      c.start_pos = int(start);
      c.block_table = &table;
      c.logits = req.logprobs >= 0 ? SeqChunk::Logits::all : SeqChunk::Logits::none;
      c.state_slot = state ? *state : -1;
      const Tensor& logits = runner.run({c}, req.hidden, true);
      if (req.logprobs >= 0) {
        const int64_t vocab = logits.size(-1);
        const float* base = logits.ptr<float>();
        for (int r = 0; r < len; ++r) {
          const int64_t pos = start + r;
          if (pos + 1 >= n) break;  // the last row predicts a token that is not in the prompt
          int32_t rank = 0;
          out.logprobs.push_back(
              row_logprob(base + r * logits.row_stride(), vocab, req.ids[size_t(pos + 1)], req.logprobs, rank));
          out.ranks.push_back(rank);
        }
      }
      if (req.hidden) {
        Tensor aux = runner.last_aux().slice_rows(0, len);
        std::vector<float> h = (aux.device == Device::cpu ? aux : aux.to(Device::cpu)).to_vector_f32();
        if (req.mean) {
          for (int r = 0; r < len; ++r)
            for (int64_t d = 0; d < hdim; ++d) out.hidden[size_t(d)] += h[size_t(r * hdim + d)] / float(n);
        } else if (last) {
          std::copy(h.end() - hdim, h.end(), out.hidden.begin());
        }
      }
    }
  } catch (...) {
    kv.release(table, hashes);
    throw;
  }
  kv.release(table, hashes);
  return out;
}

}  // namespace ts
