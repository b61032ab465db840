#include "runtime/device_logits.h"

#include <algorithm>
#include <cstring>
#include <unordered_set>

#include "core/device_memory.h"
#include "ops/cuda/logits_proc.h"  // a plain C++ header; its functions exist only in CUDA builds
#include "runtime/structured.h"

#ifdef TS_WITH_CUDA
#include "core/cuda/runtime.h"
#endif

namespace ts {

namespace {
bool has_penalties(const GenerateParams& p) {
  return p.repetition_penalty != 1.0f || p.presence_penalty != 0.0f || p.frequency_penalty != 0.0f;
}
}  // namespace

DeviceLogits::DeviceLogits(int slots, int64_t vocab, int64_t rows_cap, Device device)
    : pool_(slots), pending_(size_t(std::max(slots, 0)), 0), vocab_(vocab), rows_cap_(rows_cap), device_(device) {
  TS_CHECK(slots > 0 && vocab > 0 && rows_cap > 0, "DeviceLogits: slots {} vocab {} rows {}", slots, vocab, rows_cap);
  if (device_ == Device::cuda) {
#ifdef TS_WITH_CUDA
    st_ = std::make_unique<ops::cuda::LogitsProcState>(ops::cuda::LogitsProcState::create(slots, vocab, rows_cap));
#else
    TS_CHECK(false, "DeviceLogits: this build has no CUDA backend");
#endif
  }
}

DeviceLogits::~DeviceLogits() = default;

bool DeviceLogits::wants(const Request& r) {
  const LogitsConstraints* c = r.constraints.get();
  return has_penalties(r.params) || (c && (!c->bias().empty() || c->min_tokens() > 0));
}

bool DeviceLogits::supported(const Request& r) {
  if (!wants(r) || r.params.logprobs >= 0) return false;
  const LogitsConstraints* c = r.constraints.get();
  if (!c) return true;
  if (c->has_grammar() || c->has_bad_sequences() || c->bias().size() > size_t(ops::kLogitsMaxBias) ||
      c->min_stop_ids().size() > size_t(ops::kLogitsMaxStops))
    return false;
  // Duplicate bias ids add up in order on the host; the kernel has one writer per id.
  std::unordered_set<int32_t> ids;
  for (auto& [id, b] : c->bias())
    if (!ids.insert(id).second) return false;
  return true;
}

std::vector<int32_t> DeviceLogits::slot_info(const Request& r) {
  std::vector<int32_t> info(size_t(ops::kLogitsSlotInfo), -1);
  info[0] = info[1] = 0;
  const LogitsConstraints* c = r.constraints.get();
  if (!c) return info;
  const auto& bias = c->bias();
  info[0] = int32_t(bias.size());
  for (size_t j = 0; j < bias.size(); ++j) {
    info[2 + j] = bias[j].first;
    std::memcpy(&info[2 + ops::kLogitsMaxBias + j], &bias[j].second, 4);
  }
  if (c->min_tokens() > 0) {
    const auto& stop = c->min_stop_ids();
    info[1] = int32_t(stop.size());
    std::copy(stop.begin(), stop.end(), info.begin() + 2 + 2 * ops::kLogitsMaxBias);
  }
  return info;
}

bool DeviceLogits::acquire(Request& r) {
  if (r.logits_slot) return true;
  if (!supported(r)) return false;
  if (pool_.available() == 0) return false;
  r.logits_slot = pool_.take();
  pending_[size_t(*r.logits_slot)] = 1;
  return true;
}

bool DeviceLogits::stage_seed(const Request& r, LogitsSeeds& out) {
  if (!r.logits_slot || !pending(*r.logits_slot)) return false;
  const int slot = *r.logits_slot;
  pending_[size_t(slot)] = 0;
  LogitsSeeds::Item it;
  it.slot = slot;
  it.prompt_len = r.prompt_len;
  it.first = out.tokens.size();
  it.count = r.tokens.size();
  out.tokens.insert(out.tokens.end(), r.tokens.begin(), r.tokens.end());
  const std::vector<int32_t> info = slot_info(r);
  out.info.insert(out.info.end(), info.begin(), info.end());
  out.items.push_back(it);
  return true;
}

void DeviceLogits::run_seeds(const LogitsSeeds& s) {
  if (s.empty()) return;
  for (int32_t t : s.tokens) TS_CHECK(t >= 0, "DeviceLogits::run_seeds: unresolved future id {}", t);
  const LogitsSeeds::Item& last = s.items.back();
  seed_.slot = last.slot;
  seed_.prompt_len = last.prompt_len;
  seed_.tokens.assign(s.tokens.begin() + long(last.first), s.tokens.begin() + long(last.first + last.count));
  seed_.info.assign(s.info.end() - ops::kLogitsSlotInfo, s.info.end());
  n_seeds_ += int64_t(s.items.size());
  if (device_ != Device::cuda) return;
#ifdef TS_WITH_CUDA
  // One upload: every history, then every info row; then per item an info-row copy and the seed
  // kernel, all on the stream, after the steps launched before this one.
  const int64_t n = int64_t(s.tokens.size() + s.info.size());
  if (!tok_buf_.data || tok_buf_.numel() < n)
    tok_buf_ = Tensor::empty({std::max<int64_t>(n + n / 2, 4096)}, DType::i32, Device::cuda);
  seed_host_.assign(s.tokens.begin(), s.tokens.end());
  seed_host_.insert(seed_host_.end(), s.info.begin(), s.info.end());
  if (!up_seed_) up_seed_ = std::make_unique<StagedUpload>();
  up_seed_->upload(tok_buf_.data, seed_host_.data(), seed_host_.size() * 4);
  const int32_t* dev = tok_buf_.ptr<int32_t>();
  for (size_t i = 0; i < s.items.size(); ++i) {
    const LogitsSeeds::Item& it = s.items[i];
    const int64_t info_at = int64_t(s.tokens.size()) + int64_t(i) * ops::kLogitsSlotInfo;
    cuda::copy_async(st_->info.ptr<int32_t>() + int64_t(it.slot) * ops::kLogitsSlotInfo, dev + info_at,
                     size_t(ops::kLogitsSlotInfo) * 4);
    ops::cuda::logits_seed(*st_, it.slot, tok_buf_.narrow(0, int64_t(it.first), std::max<int64_t>(int64_t(it.count), 1)),
                           int64_t(it.count), it.prompt_len);
  }
#endif
}

ops::LogitsProcRow DeviceLogits::row(const Request& r) const {
  ops::LogitsProcRow row;
  if (!r.logits_slot) return row;
  const GenerateParams& p = r.params;
  row.slot = *r.logits_slot;
  row.repetition = p.repetition_penalty;
  row.presence = p.presence_penalty;
  row.frequency = p.frequency_penalty;
  const LogitsConstraints* c = r.constraints.get();
  row.ban_stop = c && r.num_generated() < c->min_tokens() ? 1 : 0;
  return row;
}

void DeviceLogits::upload(const std::vector<ops::LogitsProcRow>& rows, int64_t pad_to) {
  int64_t live = 0;
  for (size_t i = 0; i < rows.size(); ++i)
    if (rows[i].slot >= 0) live = int64_t(i) + 1;
  // Steps without processed rows cost nothing once the buffer holds slot -1 everywhere.
  if (live == 0 && dirty_rows_ == 0) return;
  const int64_t n = std::max({int64_t(rows.size()), pad_to, dirty_rows_});
  TS_CHECK(n <= rows_cap_, "DeviceLogits: {} rows, capacity {}", n, rows_cap_);
  TS_CHECK(st_, "DeviceLogits::upload: no device state");
  row_host_.assign(rows.begin(), rows.end());
  row_host_.resize(size_t(n));  // padding rows and rows of the previous upload: slot -1
  if (!up_rows_) up_rows_ = std::make_unique<StagedUpload>();
  up_rows_->upload(st_->rows.data, row_host_.data(), size_t(n) * sizeof(ops::LogitsProcRow));
  dirty_rows_ = live;
}

void DeviceLogits::apply(Tensor& logits) {
  TS_CHECK(st_, "DeviceLogits::apply: no device state");
#ifdef TS_WITH_CUDA
  ops::cuda::logits_process(logits, *st_);
#else
  (void)logits;
#endif
}

void DeviceLogits::count(const std::vector<int32_t>& ids) {
  TS_CHECK(st_, "DeviceLogits::count: no device state");
#ifdef TS_WITH_CUDA
  if (ids.empty()) return;
  TS_CHECK(int64_t(ids.size()) <= rows_cap_, "DeviceLogits::count: {} ids, capacity {}", ids.size(), rows_cap_);
  if (!up_ids_) up_ids_ = std::make_unique<StagedUpload>();
  up_ids_->upload(st_->ids.data, ids.data(), ids.size() * 4);
  Tensor view = st_->ids.narrow(0, 0, int64_t(ids.size()));
  ops::cuda::logits_count(view, *st_);
#else
  (void)ids;
#endif
}

const ops::cuda::LogitsProcState& DeviceLogits::state() const {
  TS_CHECK(st_, "DeviceLogits::state: no device state");
  return *st_;
}

}  // namespace ts
