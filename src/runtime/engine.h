// Engine: the serving core's public face. Threading contract:
//  - One engine thread owns everything mutable: requests, scheduler, KV cache, model runner.
//  - Any other thread (HTTP handlers) may call submit(), abort() and metrics(); they exchange
//    data with the engine thread only through the request queue and each request's Stream.
//  - The engine thread never parses JSON; HTTP threads never touch the cache or the model.
#pragma once
#include <array>
#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "core/stream_waker.h"
#include "core/tensor.h"
#include "parallel/options.h"

namespace ts::tok {
class Tokenizer;
class StreamDecoder;
}

namespace ts {

struct StructuredRequest;  // runtime/structured.h: a grammar the output must follow

enum class FinishReason { none, stop, length, abort };
const char* finish_reason_name(FinishReason r);  // "stop", "length", "abort"

// What a client asks for. Token ids are already validated against the vocabulary.
struct GenerateParams {
  std::vector<int32_t> prompt;
  int max_tokens = 16;          // > 0
  float temperature = 1.0f;     // 0 = greedy
  int top_k = 0;
  float top_p = 1.0f;
  float min_p = 0.0f;
  std::optional<uint64_t> seed;
  float presence_penalty = 0.0f, frequency_penalty = 0.0f, repetition_penalty = 1.0f;
  std::vector<std::string> stop;        // stop strings (not included in the output)
  std::vector<int32_t> stop_token_ids;  // extra stop ids (the id itself is not emitted as text)
  bool ignore_eos = false;
  int logprobs = -1;                    // -1: none; k >= 0: sampled token + top-k
  bool return_spec_trace = false;       // speculative decoding: send each verify's drafts (StreamEvent::spec_trace)
  // Logits constraints (runtime/structured.h, applied by the sampler): a grammar (compiled by
  // GrammarCache before submit), additive biases per token id, and a minimum output length
  // before which the stop ids are masked.
  std::shared_ptr<const StructuredRequest> structured;
  std::vector<std::pair<int32_t, float>> logit_bias;
  int min_tokens = 0;
  // vLLM's bad_words: words never generated. Engine::submit tokenizes each (bad_word_ids: without
  // special tokens, as written and after a space); a one-token run is banned everywhere (a -inf
  // bias: device paths too), a longer one bans its last token where the output ends with the
  // others (host logits).
  std::vector<std::string> bad_words;
  // Jump-forward decoding for a grammar (runtime/structured.h): bytes the grammar forces are
  // appended as tokens without sampling them. The engine turns it off under EAGLE3, with
  // EngineOptions::disable_jump_forward, and for requests with logprobs.
  bool jump_forward = true;
};

struct TokenLogprob {
  int32_t id;
  float logprob;
  std::vector<std::pair<int32_t, float>> top;  // top-k (id, logprob), best first
};

// One event from the engine to the client: new token ids, then a final event. The engine sends
// ids only (it never detokenises or searches stop strings); `text` is filled on the consumer's
// side by the filter it installed on the Stream (server::attach_output_processor: detok, stop
// strings, hold-back), on the consumer's thread.
struct StreamEvent {
  std::vector<int32_t> tokens;   // ids emitted in this step (after the engine's token-level stops)
  std::string text;              // consumer side: their text delta (UTF-8 safe, stop strings removed)
  std::vector<TokenLogprob> logprobs;  // one per token when requested
  bool finished = false;
  FinishReason reason = FinishReason::none;
  std::string error;             // set if the request failed inside the engine
  int prompt_tokens = 0, completion_tokens = 0, cached_tokens = 0;
  double ttft_s = 0;             // on the first event: seconds from submit to first token
  // On the final event with speculative decoding and GenerateParams::return_spec_trace: each
  // verify step's drafts and accepted count.
  std::vector<std::pair<std::vector<int32_t>, int>> spec_trace;
  // Back to a default event, keeping the buffers' capacity (Stream recycles events between its
  // producer and consumer, so a steady stream allocates nothing). Field by field: the engine
  // resets two events per row and step, and a whole new event to move from costs more. Every
  // field: a new one is reset here too.
  void reset() {
    tokens.clear();
    text.clear();
    logprobs.clear();
    finished = false;
    reason = FinishReason::none;
    error.clear();
    prompt_tokens = completion_tokens = cached_tokens = 0;
    ttft_s = 0;
    spec_trace.clear();
  }
};

// Per-request channel between the engine thread (the one producer) and one consumer (an HTTP
// connection's event loop, a CLI thread, a test). Consumers either block in pop(), or register
// a notifier (or a StreamWaker) and drain with try_pop() from their own thread.
class Stream {
 public:
  // Consumer-side processing of every event, run inside pop()/try_pop() on the consumer's
  // thread before the event is returned (detokenisation, stop strings). Install it before the
  // first pop; it may call request_stop()/cancel() on this Stream.
  using Filter = std::function<void(StreamEvent&)>;
  void set_filter(Filter f) { filter_ = std::move(f); }
  void push(StreamEvent ev);
  // Waits up to timeout_ms; returns false on timeout. Events arrive in order; the last one
  // has finished == true. Not for a stream with a notifier or waker (its pushes signal those,
  // not this wait).
  bool pop(StreamEvent& ev, int timeout_ms);
  bool try_pop(StreamEvent& ev);  // never blocks
  // Event-driven consumers: `fn` runs on the pushing thread whenever a push finds the queue
  // empty (edge-triggered: drain with try_pop until it returns false, then wait for the next
  // call). Registering with events already queued calls `fn` at once. `fn` must be cheap and
  // must not call back into this Stream's push (it typically posts to an event loop).
  void set_notify(std::function<void()> fn);
  // Event-driven consumers of many streams: like set_notify, but a push that finds the queue
  // empty marks `tag` on `waker` (core/stream_waker.h); the engine wakes it once per step.
  void set_waker(std::shared_ptr<StreamWaker> waker, uint64_t tag);
  // Client went away: the engine aborts the request (FinishReason::abort) at its next step.
  void cancel() { cancelled_ = true; }
  bool cancelled() const { return cancelled_; }
  // The client side ended the request normally (its output processor matched a stop string):
  // the engine finishes it with FinishReason::stop at its next step and counts it as finished.
  void request_stop() { stop_requested_ = true; }
  bool stop_requested() const { return stop_requested_; }
  // Starts loading the lines the engine's per-step calls read (the queue, its lock, the wake
  // target, the client flags: the members up to stop_requested_), for loops over many streams.
  void prefetch() const {
    const char* p = reinterpret_cast<const char*>(this);
    const char* end = reinterpret_cast<const char*>(&stop_requested_ + 1);
    for (; p < end + 63; p += 64) __builtin_prefetch(p);
  }

 private:
  // The engine side's members first and together (prefetch): the lock, the queue, the wake
  // target, the flags; the blocking consumer's condition variable and the filter after them.
  std::mutex mu_;
  // The queue: a ring of events that grows when full. Push and pop swap with a slot, so the
  // buffers of a consumed event travel back to the producer (push's `ev` comes back holding
  // them) instead of being freed on one thread and allocated again on the other.
  std::vector<StreamEvent> ring_;
  size_t head_ = 0, count_ = 0;
  std::function<void()> notify_;
  std::shared_ptr<StreamWaker> waker_;  // set once, like notify_ (one of the two)
  uint64_t tag_ = 0;
  std::atomic<bool> cancelled_{false}, stop_requested_{false};
  std::condition_variable cv_;
  Filter filter_;  // consumer thread only
  bool queued() const { return count_ != 0; }
  void take_front(StreamEvent& ev);
  friend class StreamOutbox;
  // Queues ev, leaving ev holding a recycled event (reset() it before reuse). True: the queue
  // was empty and a notifier or waker is set.
  bool enqueue(StreamEvent& ev);
};

// The notifications the engine thread owes at the end of a step. Pushing a step's events
// without waking anyone and then waking every consumer in one burst (flush) lets a consumer
// that serves many streams (the HTTP event loop) take the whole step's output in one wake,
// instead of being woken by the first push and racing the engine through the rest (on a
// loaded machine each wake can also preempt the engine thread). Engine thread only; keeps its
// capacity, so a steady state does not allocate.
class StreamOutbox {
 public:
  // Like s->push(ev), but a notifier or waker wake that is due runs at flush(). `ev` comes back
  // reset, holding a recycled event's buffers (reuse it for the next event).
  void push(const std::shared_ptr<Stream>& s, StreamEvent& ev);
  void flush();
  bool empty() const { return due_.empty() && used_ == 0; }

 private:
  std::vector<std::shared_ptr<Stream>> due_;
  // Waker marks owed, per waker (one, the HTTP event loop's, in a server): marked at flush under
  // one lock each, not one lock per stream and step on a line the consumer also takes.
  struct Marks {
    std::shared_ptr<StreamWaker> waker;
    std::vector<uint64_t> tags;
  };
  std::vector<Marks> marks_;
  size_t used_ = 0;  // marks_[0, used_) hold this step's tags (the rest keep their capacity)
};

struct EngineOptions {
  std::string model_dir;
  std::string device = "auto";        // auto | cpu | cuda
  int block_size = 64;
  int64_t max_total_tokens = 0;        // KV pool size in tokens (0: from mem_fraction_static)
  double mem_fraction_static = 0.0;    // 0: default per device
  int chunked_prefill_size = 8192;     // per-step token budget
  int max_num_seqs = 256;
  bool disable_prefix_cache = false;
  // auto | bf16 | fp8 | fp8_e4m3: the paged K/V cache's element type (auto/bf16: the model's).
  // fp8 stores e4m3 with scale 1.0 (a quarter of the CPU oracle's f32 bytes); CPU backend only.
  std::string kv_cache_dtype = "auto";
  // The simple loop (plan, run, apply, one after the other) instead of overlap scheduling
  // (step N+1 is planned and launched before step N's results are applied).
  bool disable_overlap_schedule = false;
  // Mixed batches: while requests decode, a step's prefill chunks take at most
  // mixed_prefill_tokens of the chunked_prefill_size budget (off: up to the whole budget);
  // 0: automatic (runtime/mixed_budget.h: the chunk that keeps a mixed step within
  // mixed_step_factor x a measured decode-only step, more while a prefill backlog builds).
  bool enable_mixed_batch = false;
  int mixed_prefill_tokens = 0;
  double mixed_step_factor = 2.5;
  int mixed_min_chunk = 0;  // automatic budget: the chunk floor while a backlog waits (0: off)
  int mixed_align_tokens = 0;  // automatic budget: a step's rows cut to a multiple of this (0: off)
  // No jump-forward decoding for grammar-constrained requests (SGLang's --disable-jump-forward):
  // every token is sampled, also where the grammar forces the next bytes.
  bool disable_jump_forward = false;
  // Host-memory KV tier (KvStore): on with the prefix cache unless disabled; its size is
  // kvstore_size_gb GiB when > 0, else kvstore_ratio x the device pool (capped at half the
  // host memory available at start).
  bool disable_kvstore = false;
  double kvstore_ratio = 2.0;
  double kvstore_size_gb = 0;
  // When a device block reaches the host tier: "write_through" (once computed, in the
  // background) or "write_back" (when the device LRU evicts it; the step waits for the copy).
  std::string kvstore_write_policy = "write_through";
  // Tests only (no flag): host-tier loads complete only after this many more plans, and on the
  // CPU backend their copies land only then (KvStore::set_load_delay_polls), so the staged
  // "admitted, still loading" state is exercised.
  int kvstore_test_load_delay_polls = 0;
  // Collect cache events (stored/removed blocks of both tiers) for Engine::set_kv_event_sink.
  bool kv_events = false;
  int64_t context_length = 0;          // 0: model's max_position_embeddings
  // Speculative decoding (EAGLE3); empty algorithm = off.
  std::string speculative_algorithm;
  std::string speculative_draft_model_path;
  int speculative_num_steps = 3;
  int speculative_eagle_topk = 1;
  int speculative_num_draft_tokens = 0;  // 0: steps + 1
  std::vector<int> eagle3_layers_to_capture;
  std::string drafter_attention_backend = "paged";
  // CUDA graphs / kernels
  bool disable_cuda_graph = false, disable_prefill_graph = false, enforce_eager = false, disable_pdl = false;
  bool gemm_autotune = false;  // CUDA: time cuBLASLt's candidates per decode-sized shape (LaunchConfig::gemm_autotune)
  // --enable-deterministic-inference (SGLang's name): batch-invariant kernels on CUDA
  // (core/cuda/runtime.h LaunchConfig::batch_invariant), so a request's output is bit-identical
  // whatever runs beside it, however its prompt was chunked, whatever the graph bucket. The CPU
  // backend is batch-invariant always (ops/cpu: one dot order per element, one pass per row).
  bool enable_deterministic_inference = false;
  int cuda_graph_max_bs = 160;
  int prefill_graph_max_tokens = 2048;
  // Parallelism (one process, one thread per GPU): tensor-parallel size (attention and dense
  // TP), MoE expert-parallel size, a forced replicated embedding, and the largest token count
  // whose all-reduce runs as the fused one-shot all-reduce + residual add + RMSNorm kernel.
  int tp_size = 1;
  int ep_size = 1;
  bool replicate_embedding = false;
  int comm_fusion_max_num_tokens = 2048;
  // The whole parallel mapping (the CLI's parallel flags; cli::apply_parallel_options fills it
  // and the four fields above). A world of one here with tp_size > 1 above: tp_size / ep_size win.
  parallel::ParallelOptions parallel;
};

// Cumulative histogram (Prometheus semantics: counts[i] = observations <= bounds[i]; the last
// count is +Inf).
struct Histogram {
  std::vector<double> bounds;
  std::vector<int64_t> counts;  // bounds.size() + 1
  double sum = 0;
  int64_t count = 0;
  explicit Histogram(std::vector<double> b = {}) : bounds(std::move(b)), counts(bounds.size() + 1, 0) {}
  void observe(double v);
};

struct EngineMetrics {
  int64_t requests_total = 0, requests_finished = 0, requests_aborted = 0;
  int64_t prompt_tokens = 0, generation_tokens = 0, cached_prompt_tokens = 0;
  int running = 0, waiting = 0;
  double kv_usage = 0;              // fraction of blocks in use
  int64_t kv_total_blocks = 0, kv_used_blocks = 0;
  double prefix_hit_rate = 0;       // cached / prompt tokens
  double step_host_us_mean = 0;     // host time per step (schedule + batch build + results)
  // Its parts (EWMA, us): Scheduler::plan + apply_plan; the worker's host share (batch build,
  // uploads: its wall time minus forward seconds); Engine::apply + reap + gauges.
  double step_plan_us_mean = 0, step_worker_host_us_mean = 0, step_apply_us_mean = 0;
  // The host time summed over all steps (a window's mean: difference two snapshots).
  double step_host_seconds = 0;
  // Device idle between consecutive steps (the thread that drives the device waiting for its
  // next step; steps after the engine had nothing to do are not counted): EWMA us per step,
  // and totals (idle share = idle / (idle + busy)). overlap_steps: steps launched while the
  // previous one was still running.
  double device_idle_us_mean = 0, device_idle_seconds = 0, device_busy_seconds = 0;
  int64_t overlap_steps = 0;
  // Where the idle seconds fall: by the kind of the step after the gap ([0] decode, [1] mixed,
  // [2] prefill, as steps_by_kind) and by how that step was launched ([0] behind a step still in
  // flight -- overlap; [1] with none in flight -- the simple loop, a drain, the first step after
  // one); and the gaps' sizes. A gap share the overlap loop should hide shows up in [k][0].
  std::array<std::array<double, 2>, 3> device_idle_seconds_by{};
  Histogram device_idle_gap_s;
  int64_t steps = 0, retractions = 0;
  // Steps by what they carried — [0] decode only, [1] mixed (decodes + prefill chunks), [2]
  // prefill only — with their device seconds (forward + sampling), and the decode rows / prefill
  // tokens of all of them: the mean decode batch and a mixed step's cost against a decode-only
  // one, from a served load (--enable-mixed-batch tuning).
  std::array<int64_t, 3> steps_by_kind{};
  std::array<double, 3> step_seconds_by_kind{};
  int64_t step_decode_rows = 0, step_prefill_tokens = 0;
  int64_t spec_verify_steps = 0, spec_accepted_tokens = 0;  // accepted length = tokens / steps
  // Engine steps on the fixed-shape speculative decode path, and those replayed as CUDA graphs;
  // device seconds in the draft model (draft steps + catch-up) and in the target verify.
  // The seconds cover spec_timed_steps of them (greedy graph steps are timed one in 8).
  int64_t spec_fixed_steps = 0, spec_graph_steps = 0, spec_timed_steps = 0;
  double spec_draft_seconds = 0, spec_verify_seconds = 0;
  Histogram ttft_s, itl_s, e2e_s;     // seconds
  // Per finished request: waiting (submit -> first admission), prefill (admission -> first
  // token), decode (first token -> finish) seconds.
  Histogram queue_s, prefill_s, decode_s;
  // Prefix hits of first admissions in tokens, per tier (host: loaded back); host-tier lookup
  // hits in blocks (every lookup, retries included: what was loaded).
  int64_t prefix_device_hit_tokens = 0, prefix_host_hit_tokens = 0, prefix_host_hit_blocks = 0;
  int64_t host_cached_prompt_tokens = 0;  // of cached_prompt_tokens, loaded from the host tier
  // Host tier (KvStore; 0 blocks: off).
  int64_t kvstore_total_blocks = 0, kvstore_used_blocks = 0;
  int64_t kvstore_writeback_blocks = 0, kvstore_bytes_written = 0, kvstore_bytes_loaded = 0;
  double kvstore_load_seconds = 0;     // copy time of completed loads (CUDA: device time)
  int64_t kvstore_load_batches = 0;
  int64_t kvstore_loaded_bytes_done = 0;  // bytes of completed loads (/ load seconds: GB/s)
  // Staged loads: steps that ran rows while an admitted request waited for its load.
  int64_t kvstore_staged_steps = 0;
  // Finished requests with a host-tier hit: how many, and their seconds per phase: queue
  // (submit -> admission), load (admission -> blocks loaded), prefill (loaded -> first token).
  int64_t kvstore_loaded_requests = 0;
  double kvstore_loaded_queue_s = 0, kvstore_loaded_load_s = 0, kvstore_loaded_prefill_s = 0;
  int block_size = 0;
};

struct KvCacheEvent;

class EngineImpl;
struct PromptPassRequest;  // runtime/prompt_pass.h
struct PromptPassResult;

class Engine {
 public:
  explicit Engine(const EngineOptions& opts);  // loads model + tokenizer (may throw)
  ~Engine();
  void start();   // starts the engine thread
  void stop();
  std::shared_ptr<Stream> submit(GenerateParams params);  // thread-safe
  // Thread-safe, blocking: a prefill-only pass (embeddings, prompt logprobs; runtime/prompt_pass.h)
  // run on the engine thread between two steps.
  PromptPassResult prompt_pass(PromptPassRequest req);
  EngineMetrics metrics() const;                          // thread-safe snapshot
  const tok::Tokenizer& tokenizer() const;
  std::shared_ptr<const tok::Tokenizer> tokenizer_ptr() const;
  int64_t context_length() const;
  int64_t vocab_size() const;
  std::vector<int32_t> eos_token_ids() const;
  std::string model_dir() const;
  std::string device_name() const;
  // Cache events (EngineOptions::kv_events): `sink` runs on the engine thread after each step
  // with the events of that step (both tiers, in order); it must be cheap (hand them to another
  // thread). Set before start().
  void set_kv_event_sink(std::function<void(std::vector<KvCacheEvent>&)> sink);
  // Multi-node (--nnodes > 1): nodes other than node 0 call run_worker() instead of start() —
  // it runs the forwards node 0 sends (runtime/node_link.h) until node 0 quits, then returns;
  // throws when node 0 dies. is_worker_node(): --node-rank > 0.
  bool is_worker_node() const;
  void run_worker();

 private:
  std::unique_ptr<EngineImpl> impl_;
};

}  // namespace ts
