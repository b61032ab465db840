// MixedBudget: how many prefill tokens a step that carries decodes may take (--enable-mixed-batch,
// issue #17 item 5). Two rules pull apart: a large prefill chunk stalls every decode of its step
// (inter-token latency p99 >> p50: an 8192-token chunk on the 8B shapes is a 190 ms step between
// 8 ms ones), while a small fixed cap (512) lets the prefill demand outrun the cap at high load,
// so requests queue for their prefill, fewer decode at once and output throughput falls (-24%
// measured at concurrency 64, 1k prompts, 128 outputs).
//
// Fixed mode (--mixed-prefill-tokens N > 0): N tokens, always.
// Auto mode (--mixed-prefill-tokens 0, the default), per step with n decode rows:
//     tokens = clamp(max(slo, backlog / horizon), min_tokens, max_tokens),
//  - slo: the largest chunk whose predicted step time t(n + chunk) stays within `factor` x the
//    decode-only step t(n), so a decode's gap across a mixed step is at most `factor` x its
//    steady gap (the ITL p99/p50 rule by construction). t(T) is an online cost model of the
//    device time of a step of T tokens (decode rows + prefill tokens), learned from every step
//    the engine runs (observe(): forward + sampling, up to the ids on the host): an EWMA per
//    quarter-octave of T, linear between measured sizes, proportional beyond the largest (an
//    overestimate while bandwidth-bound, so the chunk grows one measured size at a time). Because
//    it is measured on this device, model and batch, prefill that rides along with bandwidth-bound
//    decodes (free up to the compute crossover, as Sarathi-Serve observed) is found, and a slow
//    prefill gets a small chunk. A batch size with no decode-only figure yet runs one step of its
//    decodes alone (budget 0) to measure it.
//  - backlog / horizon: the prompt tokens waiting to be prefilled (waiting + prefilling requests),
//    spread over `drain` x the decoding requests' mean remaining steps, so the prompts queued now
//    are prefilled by the time the batch drains (a full batch, uniform steps) instead of queueing
//    while the batch shrinks; this is what a fixed 512 lacks at a cold start (bench serving's
//    2 x concurrency requests: -24% on the H200).
// Tested on a fake clock with three step-cost shapes (tests/unit/runtime/mixed_budget_test.cpp): both
// rules hold where prefill rides along with decode; where it cannot (a purely additive cost) no
// budget keeps 95% of the unmixed throughput and this one matches the fixed 512; on the H200's
// measured costs (bench --mixed-chunks) both hold in steady state, and from a cold start it
// matches the fixed 512. Served on the H200 it reaches 0.86-0.94x of no mixing (README).
// SGLang, vLLM and TensorRT-LLM use a fixed chunk (chunked_prefill_size, max_num_batched_tokens,
// max_num_tokens); Sarathi-Serve picks its token budget offline from a TBT SLO; this is that
// budget measured online, plus the backlog term.
// Not thread-safe: the engine thread observes and the scheduler (same thread) asks.
#pragma once
#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>

namespace ts {

struct MixedBudgetOptions {
  int fixed = 0;          // > 0: always this many tokens (no model)
  double factor = 2.5;    // a mixed step may take this many times a decode-only step
  int horizon = 4;        // steps over which a prefill backlog is spread (no decode horizon known)
  double drain = 0.5;     // ... else this share of the decodes' mean remaining steps
  int min_tokens = 64;    // floor (and rounding unit) of the auto budget
  // While at least this many prompt tokens wait, a step takes at least this many (0: off, the
  // default; --mixed-min-chunk). Why it exists: GEMMs are not linear in their rows — on the H200
  // (8B shapes, bench --mixed-chunks) 64 decodes + 256 prefill tokens take 15.6 ms and + 512 take
  // 18.2 ms — so a smaller chunk spends nearly a full chunk's time on fewer tokens. Why it is off:
  // served on the H200 (8B, 1k prompts, 128 outputs; floor 512 with drain 0.35 against off with
  // drain 0.5) it raised throughput at concurrency 16 (0.89x of no mixing vs 0.81x) and 256
  // (0.89x vs 0.85x) but lowered it at 64 (0.81x vs 0.88x), the load item 5's rule is set at:
  // served mixed steps then cost ~32 us per prefill token either way (since fixed: ~24, README).
  int efficient_tokens = 0;
  // The step's rows (decode rows + prefill tokens) are cut to a multiple of this once they reach
  // it (rounded up instead where cutting would leave less than min_tokens of prefill); 0: off
  // (--mixed-align-tokens). Why: a GEMM's time steps with its row tiles, not its rows. H200, 8B
  // shapes (bench --gemm-lab), one forward's GEMMs: 512 rows 9.6 ms, 576 rows 12.5 ms, 768 rows
  // 14.4 ms, 1024 rows 19.2 ms; so 54 decodes + a 512-token chunk (566 rows, the 576-row graph
  // bucket) pay 2.9 ms more GEMM time than 54 + 458 do, and the decodes ride along only where the
  // total sits on a tile boundary. Prefill graph buckets above 512 are steps of 64, so the aligned
  // totals are buckets. Off by default: served on the H200 (1k prompts, 128 outputs; gpu_core2,
  // autoalign) 256 raised out tok/s by 4% at concurrency 16 and 2.5% at 64, within the run-to-run
  // spread of ±3%, and left 256 unchanged; ITL p50 fell 22% at 64. The simulation's cost tables
  // are piecewise linear (no tile steps), so there it only shrinks chunks.
  int align_tokens = 0;
  int max_tokens = 8192;  // ceiling (the step's token budget, --chunked-prefill-size)
  int initial = 512;      // before the cost model has figures
};

class MixedBudget {
 public:
  explicit MixedBudget(MixedBudgetOptions o = {}) : o_(o) {}
  const MixedBudgetOptions& options() const { return o_; }
  bool automatic() const { return o_.fixed <= 0; }

  // A step that ran: decode rows, prefill tokens, device seconds.
  void observe(int decode_rows, int prefill_tokens, double seconds) {
    const int64_t t = int64_t(std::max(decode_rows, 0)) + std::max(prefill_tokens, 0);
    if (seconds <= 0 || t <= 0) return;
    if (prefill_tokens == 0) probed_[size_t(bucket(t))] = 1;
    cost_[size_t(bucket(t))].add(seconds, double(t));
  }

  // Prefill tokens for a step with `decode_rows` decodes while `backlog` prompt tokens wait to be
  // prefilled (a lower bound is enough: the caller may stop counting past max_tokens * horizon);
  // horizon_steps: the decoding requests' mean remaining steps (0: unknown, `horizon` is used).
  // 0 only for a probe (see above).
  int tokens(int decode_rows, int64_t backlog, int64_t horizon_steps = 0) const {
    if (!automatic()) return o_.fixed;
    const int unit = std::max(1, o_.min_tokens), cap = std::max(unit, o_.max_tokens);
    double t = o_.initial;
    const double dec = step_seconds(decode_rows);
    // No decode-only figure near this batch size (every step so far carried prefill): this step
    // runs its decodes alone, once, to measure it.
    if (dec <= 0 && !probe_done(decode_rows)) return 0;
    if (dec > 0) {
      // The largest multiple of `unit` whose predicted step stays within factor x decode-only
      // (step_seconds is non-decreasing in tokens: binary search).
      const double limit = o_.factor * dec;
      int lo = 0, hi = cap / unit;
      while (lo < hi) {
        const int mid = (lo + hi + 1) / 2;
        if (step_seconds(int64_t(decode_rows) + int64_t(mid) * unit) <= limit) lo = mid;
        else hi = mid - 1;
      }
      t = double(lo) * unit;
    }
    // More requests wait for their prefill than decode (a burst of arrivals, the start of a
    // load): stalling the few decodes costs few tokens' latency and buys the many waiting ones
    // their first token and a place in the decode batch.
    // Spread the backlog evenly over the steps the decoding requests still need, so the prompts
    // waiting now are prefilled by the time the batch drains (uniform steps, a full batch).
    const int64_t h = horizon_steps > 0 ? std::max<int64_t>(int64_t(double(horizon_steps) * o_.drain), 1) : o_.horizon;
    t = std::max(t, double(backlog) / double(h));
    if (o_.efficient_tokens > 0 && backlog >= o_.efficient_tokens) t = std::max(t, double(o_.efficient_tokens));
    int64_t r = int64_t(std::min<double>(t, double(cap))) / unit * unit;
    r = std::clamp<int64_t>(r, unit, cap);
    const int64_t a = o_.align_tokens, total = int64_t(std::max(decode_rows, 0)) + r;
    if (a > 0 && total >= a) {
      const int64_t down = total / a * a - std::max(decode_rows, 0), up = down + a;
      if (down >= unit) r = down;
      else if (up <= cap) r = up;
    }
    return int(r);
  }

  // Predicted device seconds of a step of `tokens` tokens (decode rows + prefill tokens): linear
  // between the measured neighbours; beyond the largest measured size proportional to the tokens
  // (an overestimate where the step is bandwidth-bound: the budget then grows one measured size
  // at a time). 0: nothing measured at or below this size.
  double step_seconds(int64_t tokens) const {
    if (tokens <= 0) return 0.0;
    const double x = double(tokens);
    const int b = bucket(tokens);
    // The measured sizes nearest below (or at) and above x: bucket b's own point is on one side.
    int lo = -1, hi = -1;
    if (cost_[size_t(b)].n > 0) (cost_[size_t(b)].w <= x ? lo : hi) = b;
    for (int i = b - 1; lo < 0 && i >= 0; --i)
      if (cost_[size_t(i)].n > 0) lo = i;
    for (int i = b + 1; hi < 0 && i < kBuckets; ++i)
      if (cost_[size_t(i)].n > 0) hi = i;
    if (lo < 0) return 0.0;  // nothing measured this small: unknown (a larger step says little)
    const Ewma& a = cost_[size_t(lo)];
    if (hi < 0) return a.v * std::max(1.0, x / std::max(1.0, a.w));
    const Ewma& z = cost_[size_t(hi)];
    const double f = std::clamp((x - a.w) / std::max(1e-9, z.w - a.w), 0.0, 1.0);
    return std::max(a.v, a.v + f * (z.v - a.v));
  }

 private:
  static constexpr int kPerOctave = 4;
  static constexpr int kBuckets = 16 * kPerOctave;  // up to 64k tokens
  struct Ewma {
    double v = 0, w = 0;  // seconds, and the mean token count they were measured at
    int64_t n = 0;
    void add(double x, double tokens) {
      const double a = n < 8 ? 1.0 / double(n + 1) : 0.125;  // plain mean for the first few
      v += a * (x - v);
      w += a * (tokens - w);
      ++n;
    }
  };
  // Four buckets per octave of the token count: 1, 2, 3, 4, 5-6, 7-8, 9-11, ...
  static int bucket(int64_t t) {
    const int b = int(std::floor(kPerOctave * std::log2(double(std::max<int64_t>(t, 1))) + 1e-9));
    return std::clamp(b, 0, kBuckets - 1);
  }
  bool probe_done(int decode_rows) const { return decode_rows <= 0 || probed_[size_t(bucket(decode_rows))]; }
  MixedBudgetOptions o_;
  std::array<Ewma, kBuckets> cost_{};
  std::array<char, kBuckets> probed_{};  // a decode-only step of this size was measured
};

}  // namespace ts
