// BatchBuilder's attention metadata for mixed batches: the leading short-query sequences (decodes,
// verify rows) are marked so the CUDA dispatcher runs them through the decode kernel and the
// chunks through the prefill kernel (ops::AttnMeta::lead_decode_*); padding sequences never count.
#include <gtest/gtest.h>

#include "runtime/model_runner.h"

using namespace ts;

namespace {

struct Built {
  ops::AttnMeta attn;
  std::vector<int32_t> cu;
};

Built build(const std::vector<int>& q_lens, BuildOptions opt = {}) {
  std::vector<std::vector<int32_t>> ids;
  std::vector<int32_t> table(64);
  for (size_t i = 0; i < table.size(); ++i) table[i] = int32_t(i);
  std::vector<SeqChunk> chunks;
  ids.reserve(q_lens.size());
  for (int q : q_lens) {
    ids.emplace_back(size_t(q), 7);
    chunks.push_back({ids.back().data(), q, 10, &table, SeqChunk::Logits::last});
  }
  BatchBuilder b;
  ForwardBatch batch;
  b.build(chunks, 16, Device::cpu, batch, opt);
  Built out{batch.attn, {}};
  for (int64_t i = 0; i < batch.attn.cu_q.numel(); ++i) out.cu.push_back(batch.attn.cu_q.ptr<int32_t>()[i]);
  return out;
}

}  // namespace

TEST(BatchBuilder, MarksLeadingDecodesOfAMixedBatch) {
  Built m = build({1, 1, 4, 1, 512, 1, 100});
  EXPECT_EQ(m.attn.lead_decode_seqs, 4);
  EXPECT_EQ(m.attn.lead_decode_max_q, 4);
  EXPECT_EQ(m.attn.lead_decode_rows, 7);
  EXPECT_EQ(m.cu[size_t(m.attn.lead_decode_seqs)], m.attn.lead_decode_rows);
  EXPECT_EQ(m.attn.max_q_len, 512);
}

TEST(BatchBuilder, LeadStopsAtTheFirstLongQuery) {
  Built c = build({64, 1, 1});  // a chunk first: nothing leads
  EXPECT_EQ(c.attn.lead_decode_seqs, 0);
  EXPECT_EQ(c.attn.lead_decode_rows, 0);
  Built v = build({8, 9, 1});  // 8 is still a verify row, 9 is not
  EXPECT_EQ(v.attn.lead_decode_seqs, 1);
  EXPECT_EQ(v.attn.lead_decode_max_q, 8);
  EXPECT_EQ(v.attn.lead_decode_rows, 8);
}

TEST(BatchBuilder, AllDecodesAndPadding) {
  Built d = build({1, 1, 1});
  EXPECT_EQ(d.attn.lead_decode_seqs, 3);  // every sequence: the dispatcher needs no split
  EXPECT_EQ(d.attn.max_q_len, 1);
  // A decode graph bucket pads with one-token dummy sequences: they are short too, and the batch
  // stays one decode launch (max_q_len 1).
  BuildOptions pad;
  pad.pad_seqs = 5;
  pad.pad_tokens = 8;
  Built p = build({1, 1}, pad);
  EXPECT_EQ(p.attn.num_seqs, 5);
  EXPECT_EQ(p.attn.max_q_len, 1);
  EXPECT_EQ(p.attn.lead_decode_seqs, 5);
  // A mixed batch with padding after its chunk: the padding is past the chunk, never in the lead.
  BuildOptions pad2;
  pad2.pad_seqs = 4;
  pad2.pad_tokens = 40;
  Built q = build({1, 30}, pad2);
  EXPECT_EQ(q.attn.lead_decode_seqs, 1);
  EXPECT_EQ(q.attn.lead_decode_rows, 1);
}

TEST(BatchBuilder, EmptyBatch) {
  Built e = build({});
  EXPECT_EQ(e.attn.num_seqs, 0);
  EXPECT_EQ(e.attn.lead_decode_seqs, 0);
  EXPECT_EQ(e.attn.lead_decode_rows, 0);
}
