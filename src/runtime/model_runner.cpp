#include "runtime/model_runner.h"

#include <algorithm>

namespace ts {

size_t ModelRunner::kv_bytes_per_token(const models::Model& m) { return m.kv_spec().bytes_per_token(m.dtype()); }

ModelRunner::ModelRunner(std::shared_ptr<models::Model> model, int64_t num_blocks, int block_size)
    : model_(std::move(model)) {
  TS_CHECK(num_blocks > 0 && block_size > 0, "KV pool needs blocks (got {} blocks of {})", num_blocks, block_size);
  models::KvSpec s = model_->kv_spec();
  kv_.block_size = block_size;
  kv_.num_blocks = num_blocks;
  for (int l = 0; l < s.num_layers; ++l) {
    kv_.k.push_back(Tensor::zeros({num_blocks, block_size, s.k_heads, s.k_dim}, model_->dtype(), model_->device()));
    if (s.v_heads > 0)
      kv_.v.push_back(Tensor::zeros({num_blocks, block_size, s.v_heads, s.v_dim}, model_->dtype(), model_->device()));
    else
      kv_.v.push_back(Tensor());
  }
}

// Moves a host vector into a device tensor (or wraps it on the CPU: no copy).
static Tensor stage(std::vector<int32_t>& v, std::vector<int64_t> shape, Device dev) {
  Tensor host = Tensor::from_blob(v.data(), std::move(shape), DType::i32, Device::cpu);
  return dev == Device::cpu ? host : host.to(dev);
}

void BatchBuilder::build(const std::vector<SeqChunk>& chunks, int bs, Device dev, ForwardBatch& batch_) {
  ids_.clear(), pos_.clear(), slots_.clear(), cu_q_.assign(1, 0), kv_len_.clear(), logit_rows_.clear();
  size_t max_blocks = 1;
  int max_q = 0, max_kv = 0;
  for (auto& c : chunks) max_blocks = std::max(max_blocks, c.block_table->size());
  tables_.assign(chunks.size() * max_blocks, 0);
  for (size_t b = 0; b < chunks.size(); ++b) {
    const SeqChunk& c = chunks[b];
    const auto& table = *c.block_table;
    int end = c.start_pos + c.num_tokens;
    TS_CHECK(int64_t(table.size()) * bs >= end, "block table covers {} tokens, needs {}", table.size() * bs, end);
    for (int i = 0; i < c.num_tokens; ++i) {
      int p = c.start_pos + i;
      if (c.logits == SeqChunk::Logits::all || (c.logits == SeqChunk::Logits::last && i == c.num_tokens - 1))
        logit_rows_.push_back(int32_t(ids_.size()));
      ids_.push_back(c.tokens[i]);
      pos_.push_back(p);
      slots_.push_back(table[size_t(p / bs)] * bs + p % bs);
    }
    cu_q_.push_back(int32_t(ids_.size()));
    kv_len_.push_back(end);
    std::copy(table.begin(), table.end(), tables_.begin() + long(b * max_blocks));
    max_q = std::max(max_q, c.num_tokens);
    max_kv = std::max(max_kv, end);
  }
  int t_n = int(ids_.size()), b_n = int(chunks.size());
  batch_.num_tokens = t_n;
  batch_.input_ids = stage(ids_, {t_n}, dev);
  batch_.positions = stage(pos_, {t_n}, dev);
  batch_.slot_mapping = stage(slots_, {t_n}, dev);
  batch_.attn.cu_q = stage(cu_q_, {b_n + 1}, dev);
  batch_.attn.kv_len = stage(kv_len_, {b_n}, dev);
  batch_.attn.block_tables = stage(tables_, {b_n, int64_t(max_blocks)}, dev);
  batch_.attn.block_size = bs;
  batch_.attn.num_seqs = b_n;
  batch_.attn.max_q_len = max_q;
  batch_.attn.max_kv_len = max_kv;
  batch_.num_logits = int(logit_rows_.size());
  batch_.logits_index = stage(logit_rows_, {batch_.num_logits}, dev);
  batch_.mode = max_q <= 1 ? ForwardMode::decode : ForwardMode::prefill;
}

const Tensor& ModelRunner::run(const std::vector<SeqChunk>& chunks, bool capture_aux) {
  builder_.build(chunks, kv_.block_size, model_->device(), batch_);
  int n_cap = int(model_->capture_layers().size());
  batch_.capture_aux = capture_aux && n_cap > 0;
  if (batch_.capture_aux)
    batch_.aux_hidden = Tensor::empty({batch_.num_tokens, n_cap * model_->config().hidden_size}, model_->dtype(), model_->device());
  Tensor logits = model_->forward(batch_, kv_);
  logits_host_ = logits.device == Device::cpu ? logits : logits.to(Device::cpu);
  return logits_host_;
}

}  // namespace ts
