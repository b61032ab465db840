// The engine thread, one step at a time: drain submissions -> Scheduler::plan -> apply_plan
// (plan transitions) -> Worker::execute -> apply (tokens, KV commits, stops, transitions) ->
// stream events out. See engine.h for the threading contract and step.h for the data.
#include "runtime/engine.h"

#include <algorithm>
#include <future>
#include <random>
#include <unordered_set>

#include "core/device_memory.h"
#include "core/log.h"
#include "core/thread_clock.h"
#include "models/model.h"
#include "runtime/cuda_graph_runner.h"
#include "runtime/device_logits.h"
#include "runtime/model_runner.h"
#include "runtime/node_link.h"
#include "runtime/plain_worker.h"
#include "runtime/prompt_pass.h"
#include "runtime/sampler.h"
#include "runtime/scheduler.h"
#include "runtime/spec_worker.h"
#include "runtime/structured.h"
#include "runtime/tp_workers.h"
#include "tokenizer/tokenizer.h"

#ifdef TS_WITH_CUDA
#include "core/cuda/runtime.h"
#endif

namespace ts {

static double secs(Clock::duration d) { return std::chrono::duration<double>(d).count(); }

// A step's kind as EngineMetrics counts it: 0 decode only, 1 mixed (decodes + prefill chunks),
// 2 prefill only.
static size_t step_kind(const StepPlan& plan) { return plan.prefill_tokens <= 0 ? 0 : plan.decode_rows > 0 ? 1 : 2; }

// Idle/busy accounting of the thread that drives the device: begin() at a step's start, end()
// when its ids are on the host (fresh: the engine had no work since the previous step, so the
// gap before this one is not idle time the scheduler caused and is not counted).
//  - CPU: host clocks (the device is this thread).
//  - CUDA (use_device_events): timing events on the compute stream, so the figure is the GPU's
//    own idle time between the previous step's last op and this step's first. The start marker
//    is recorded where the step's first device work is enqueued (begin(true): the runner tells
//    step_device_start() before its batch upload), not at begin(): the host time spent resolving
//    and building the batch is time the GPU has nothing to do, so it is idle, not busy. A
//    start recorded while the GPU is still busy gets the previous end's timestamp (gap 0). Two
//    alternating start/end pairs: at end() of step N, N-1's end and N's start are reached (end()
//    waits for N's start marker, which the GPU passes when it begins N), so N itself is never
//    waited for; N's own busy time is counted one step late (totals exact but the last step's).
struct IdleClock final : StepStartListener {
  Clock::time_point last_end{};
  bool have_end = false;
  Clock::time_point t0{};
  // defer_start: the start marker waits for step_device_start() (the plain worker's steps);
  // else (EAGLE3 steps, whose draft may run first) it is recorded now.
  void begin(bool defer_start = false) {
    t0 = Clock::now();
#ifdef TS_WITH_CUDA
    if (marks_) {
      pending_start_ = defer_start;
      if (!defer_start) marks_->record(2 * pair_);
    }
#else
    (void)defer_start;
#endif
  }
  void step_device_start() override {
#ifdef TS_WITH_CUDA
    if (pending_start_) {
      marks_->record(2 * pair_);
      pending_start_ = false;
    }
#endif
  }
  void end(bool fresh, StepResult& r) {
#ifdef TS_WITH_CUDA
    if (marks_) {
      const int cur = pair_, prev = 1 - pair_;
      if (pending_start_) {  // no device work was announced: the step starts (and ends) here
        marks_->record(2 * cur);
        pending_start_ = false;
      }
      marks_->record(2 * cur + 1);
      // A step that copied no ids (a prefill chunk that samples nothing) may still be running:
      // its start (and so the previous end) is reached as soon as the GPU begins it.
      marks_->synchronize(2 * cur);
      r.idle_before_s = fresh || !have_end ? -1.0 : std::max(0.0f, marks_->elapsed_ms(2 * prev + 1, 2 * cur)) * 1e-3;
      r.busy_s = have_end ? marks_->elapsed_ms(2 * prev, 2 * prev + 1) * 1e-3 : 0.0;
      have_end = true;
      pair_ = prev;
      return;
    }
#endif
    const auto now = Clock::now();
    r.idle_before_s = fresh || !have_end ? -1.0 : secs(t0 - last_end);
    r.busy_s = secs(now - t0);
    last_end = now;
    have_end = true;
  }
  void failed() {  // a step threw: its marks may never complete
    have_end = false;
#ifdef TS_WITH_CUDA
    pending_start_ = false;
#endif
  }
  void use_device_events() {  // on the thread that drives the device (its stream)
#ifdef TS_WITH_CUDA
    if (!marks_) marks_ = std::make_unique<cuda::StreamMarks>(4);
#endif
  }

#ifdef TS_WITH_CUDA
 private:
  std::unique_ptr<cuda::StreamMarks> marks_;  // [2p]: start, [2p+1]: end of pair p
  int pair_ = 0;
  bool pending_start_ = false;
#endif
};

// The overlap loop's device thread: runs staged steps (PlainWorker::run_staged) one at a time,
// in launch order, into two alternating slots. The engine thread stages slot s, launch(s),
// then applies the other slot's result while this thread runs s.
class StepThread {
 public:
  // device_events: time the device's idle gaps with CUDA events (IdleClock).
  StepThread(PlainWorker& w, ModelRunner& runner, bool device_events)
      : w_(w), runner_(runner), device_events_(device_events), th_([this] { loop(); }) {}
  ~StepThread() {
    {
      std::lock_guard<std::mutex> lk(mu_);
      quit_ = true;
    }
    cv_.notify_all();
    th_.join();
  }
  StagedStep staged[2];
  StepResult result[2];
  // Runs slot s after the step launched before it (whose result resolves s's futures; none:
  // prev = -1). fresh: the engine had no work since that step (its idle time is not counted).
  void launch(int s, int prev, bool fresh) {
    {
      std::lock_guard<std::mutex> lk(mu_);
      queue_.push_back({s, prev, fresh});
      done_[s] = false;
    }
    cv_.notify_all();
  }
  // Waits for slot s; rethrows what its step threw.
  void wait(int s) {
    std::unique_lock<std::mutex> lk(mu_);
    cv_.wait(lk, [&] { return done_[s]; });
    if (err_[s]) {
      std::exception_ptr e = err_[s];
      err_[s] = nullptr;
      std::rethrow_exception(e);
    }
  }

 private:
  struct Job {
    int slot, prev;
    bool fresh;
  };
  void loop() {
#ifdef TS_WITH_CUDA
    if (cuda_available()) cuda::set_device(0);  // rank 0's GPU, as the engine thread's
    cuda::set_launch_config(launch_cfg_);
#endif
    if (device_events_) clock_.use_device_events();
    std::unique_lock<std::mutex> lk(mu_);
    while (true) {
      cv_.wait(lk, [&] { return quit_ || !queue_.empty(); });
      if (queue_.empty()) return;
      Job j = queue_.front();
      queue_.erase(queue_.begin());
      lk.unlock();
      std::exception_ptr err;
      try {
        StepResult& r = result[j.slot];
        const StepResult* prev = j.prev >= 0 ? &result[j.prev] : nullptr;
        const bool fresh = j.fresh;
        // end() after run_staged's clear(): the idle figure is written into the result.
        runner_.set_step_listener(&clock_);
        clock_.begin(true);
        w_.run_staged(staged[j.slot], prev, r);
        clock_.end(fresh, r);
      } catch (...) {
        err = std::current_exception();
        clock_.failed();
      }
      lk.lock();
      err_[j.slot] = err;
      done_[j.slot] = true;
      cv_.notify_all();
    }
  }
  PlainWorker& w_;
  ModelRunner& runner_;  // the plain worker's: tells clock_ where a step's device work starts
  std::mutex mu_;
  std::condition_variable cv_;
  // Launch order (two jobs at most, one per slot); its capacity is set here, before th_ starts,
  // so launching a step never allocates (a std::deque did, every 42 steps).
  std::vector<Job> queue_ = [] {
    std::vector<Job> q;
    q.reserve(4);
    return q;
  }();
  bool done_[2] = {true, true};
  std::exception_ptr err_[2];
  bool quit_ = false;
  IdleClock clock_;
  bool device_events_ = false;
#ifdef TS_WITH_CUDA
  cuda::LaunchConfig launch_cfg_ = cuda::launch_config();  // the creating thread's (the engine's)
#endif
  std::thread th_;  // last: starts after the members above exist
};

class EngineImpl {
 public:
  explicit EngineImpl(const EngineOptions& o);
  ~EngineImpl() { stop(); }
  void start() { thread_ = std::thread([this] { loop(); }); }
  void stop();
  std::shared_ptr<Stream> submit(GenerateParams p);
  PromptPassResult prompt_pass(PromptPassRequest req);
  EngineMetrics metrics() const {
    std::lock_guard<std::mutex> lk(metrics_mu_);
    return metrics_;
  }

  EngineOptions opts;
  Device device = Device::cpu;
  std::shared_ptr<tok::Tokenizer> tokenizer;
  std::shared_ptr<models::Model> model;
  std::unique_ptr<ModelRunner> runner;
  std::shared_ptr<StepChannel> step_channel;  // multi-node (node_link.h); null on one node
  int nnodes = 1, node_rank = 0;
  std::unique_ptr<KvCache> kv;
  std::unique_ptr<KvStore> store;  // the host tier (null: off)
  std::function<void(std::vector<KvCacheEvent>&)> kv_event_sink;
  std::unique_ptr<Scheduler> sched;
  std::unique_ptr<SpecWorker> spec;   // the EAGLE3 worker (null: the plain worker runs)
  std::unique_ptr<PlainWorker> plain;
  Worker* worker = nullptr;
  std::unordered_set<int32_t> eos;
  int64_t context_len = 0;

 private:
  void loop();
  void step();
  // The simple loop's step; the overlap loop's step (plan N+1, stage, pre-apply, launch, then
  // apply N); drain(): waits for and applies the step in flight (false: none).
  void step_sync();
  void step_overlap();
  bool drain();
  // Whether the next plan may be staged before the step in flight is applied.
  bool overlap_ok();
  // Overlap: what applying a plan will do, done when it is launched — num_computed advanced,
  // a future id appended for every sampled row (its index kept in future_pos_[slot]),
  // Prefilling -> Decoding, `finishing` when the id reaches max_tokens / the context.
  void pre_apply(StepPlan& plan, int slot);
  // Overlap: resolves the futures of a launched plan and does what apply() does for it.
  void apply_overlapped(int slot);
  void intake();
  // The plan's transitions, its rejected requests, and the worker handles its requests need.
  void apply_plan(StepPlan& plan);
  // The one place results change requests: appends ids, advances num_computed, commits KV,
  // checks token-level stops, makes the transitions, streams the events.
  void apply(StepPlan& plan, const StepResult& res);
  // Why a request stops at generated id t placed at tokens[pos] (none: it goes on).
  FinishReason stop_reason(const Request& r, int32_t t, size_t pos) const;
  void observe_token_time(Request& r, StreamEvent& ev, Clock::time_point now);
  // The idle gap before a step of `plan`; behind: it was launched while another step was in
  // flight (EngineMetrics::device_idle_seconds_by).
  void observe_idle(const StepPlan& plan, const StepResult& res, bool behind);
  // The automatic mixed budget's cost model learns from steps with decodes (their device time:
  // forward + sampling, up to the ids on the host).
  // Also counts the step by kind (engine thread only; published by update_metrics).
  void observe_cost(const StepPlan& plan, const StepResult& res) {
    if (mixed_budget_ && plan.decode_rows > 0) mixed_budget_->observe(plan.decode_rows, plan.prefill_tokens, res.forward_s);
    if (plan.decode_rows <= 0 && plan.prefill_tokens <= 0) return;
    const size_t kind = step_kind(plan);
    ++steps_by_kind_[kind];
    step_seconds_by_kind_[kind] += res.forward_s;
    step_decode_rows_ += plan.decode_rows;
    step_prefill_tokens_ += plan.prefill_tokens;
  }
  std::array<int64_t, 3> steps_by_kind_{};
  std::array<double, 3> step_seconds_by_kind_{};
  int64_t step_decode_rows_ = 0, step_prefill_tokens_ = 0;
  std::unique_ptr<MixedBudget> mixed_budget_;  // --enable-mixed-batch, automatic (null: fixed or off)
  // Appends one generated token at time `now`; returns why the request stops on it (none: it
  // goes on). Inter-token latencies go to itl_ (observed once per step, one lock).
  FinishReason push_token(Request& r, int32_t t, const TokenLogprob* lp, StreamEvent& ev, Clock::time_point now);
  // Jump-forward (runtime/structured.h): appends the tokens r's grammar forced after its last
  // token (waiting for the mask thread's decision), adds them to `ev`; a future id of the step
  // in flight is replaced (that step's row for r becomes void). Returns stop when a forced token
  // is a stop id (the run is cut there).
  FinishReason jump(Request& r, StreamEvent& ev);
  // apply()'s last move for a request that goes on: emit its event, or, when it may jump
  // forward, keep it for apply_jumps() -- which runs after every row was accepted, so the mask
  // threads decide all forced runs of the step in parallel while the engine waits for the first.
  void emit_or_jump(Request& r, StreamEvent& ev);
  void apply_jumps();
  std::vector<std::pair<Request*, StreamEvent>> jumps_;  // reused
  // Every live request's constraints closed (a failed step: mask waiters must not hang).
  void close_constraints();
  std::vector<int32_t> forced_;  // jump() scratch
  // New requests whose first forced run (before any token) is not decided yet: admitted once it is.
  std::vector<std::shared_ptr<Request>> jump_wait_;
  void finish(Request& r, FinishReason why, StreamEvent& ev);
  void emit(Request& r, StreamEvent& ev);
  StreamOutbox outbox_;  // emit()'s wakes, run once per loop iteration
  // The event a result row builds, reused row after row: emit() hands it to the stream and gets
  // a consumed event's buffers back, so a steady step allocates no event.
  StreamEvent row_event_;
  StreamEvent& row_event() {
    row_event_.reset();
    return row_event_;
  }
  void fail_request(Request& r, const std::string& msg);
  void reserve_for(Request& r);
  void update_metrics(double host_us);
  // The CPU backend's host-tier copies since the last call, in us (run inline: device work there).
  double inline_copy_us() { return store ? store->take_inline_copy_seconds() * 1e6 : 0.0; }
  // This thread's CPU time in us: the host-time figures count the engine's own work, not the
  // time it waits or is descheduled (a 2-core machine running a CPU forward beside it).
  static double thread_cpu_us() { return thread_cpu_seconds() * 1e6; }
  void start_graphs(const EngineOptions& o, const SchedulerOptions& so);
  void refresh_gauges();  // running/waiting/KV usage
  void start_kvstore(const EngineOptions& o);
  // Multi-node: the step channel (node 0 attaches it to the runner; workers keep it).
  void start_nodes(const parallel::ParallelOptions& po, const io::ModelConfig& cfg, int64_t blocks, int bs, int max_seqs);
  DType kv_dtype = DType::f32;  // the paged K/V cache's element type (--kv-cache-dtype)

  void publish_kv_events();
  std::vector<KvCacheEvent> kv_events_;  // reused

  std::thread thread_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::vector<std::shared_ptr<Request>> incoming_;
  // Prefill-only passes (prompt_pass) waiting for the engine thread: run(true) between steps,
  // run(false) at shutdown (the caller gets an error).
  std::vector<std::function<void(bool)>> passes_;
  bool stopping_ = false;
  int64_t next_id_ = 1;
  std::mt19937_64 seed_rng_{std::random_device{}()};

  mutable std::mutex metrics_mu_;
  EngineMetrics metrics_;
  double host_us_ewma_ = 0;
  struct SpecLog {
    Clock::time_point at{};
    int64_t verify_steps = 0, accepted_tokens = 0, fixed_steps = 0, graph_steps = 0;
  } spec_log_;
  void log_spec_stats();
  StepPlan plan_;      // reused every step (simple loop)
  StepResult result_;  // reused every step (simple loop)
  // Overlap loop: two plan slots, alternating; inflight_ is the slot launched and not yet
  // applied (-1: none). keep_ holds the running requests of each launched plan alive until
  // it is applied (a request may finish and be reaped meanwhile).
  bool overlap_ = false;
  std::unique_ptr<StepThread> thread_steps_;
  StepPlan plans_[2];
  std::vector<size_t> future_pos_[2];
  std::vector<std::shared_ptr<Request>> keep_[2];
  int inflight_ = -1, next_slot_ = 0;
  bool launched_behind_[2] = {false, false};  // slot's step launched while the other was in flight
  bool was_idle_ = true;  // the engine had no work since the last step it launched
  IdleClock sync_clock_;
  double idle_us_ewma_ = 0;
  int64_t idle_counted_ = 0;
  int64_t spec_verify_steps_ = 0, spec_accepted_tokens_ = 0;
  int64_t staged_steps_ = 0;  // steps with rows while a request waited for its host-tier load
  std::vector<double> itl_;  // this step's inter-token latencies (reused)
  double part_us_[3] = {}, part_ewma_[3] = {};  // plan, worker host, apply (this step; EWMA)
  // This thread's CPU clock before the loop's intake: a step's host time (and its plan part)
  // counts the intake that preceded it (new requests, disconnect checks over every request).
  double loop_c0_ = 0;
};

#ifdef TS_WITH_CUDA
// The launch settings an engine's options ask for (core/cuda/runtime.h LaunchConfig).
static cuda::LaunchConfig launch_config_of(const EngineOptions& o) {
  return {.pdl = !o.disable_pdl, .batch_invariant = o.enable_deterministic_inference, .gemm_autotune = o.gemm_autotune};
}
#endif

EngineImpl::EngineImpl(const EngineOptions& o) : opts(o) {
#ifdef TS_WITH_CUDA
  // This engine's launch settings (core/cuda/runtime.h) on the constructing thread (loading,
  // warm-up, graph capture) and, copied at their start, on the TP worker and device threads it
  // creates; loop() installs them on the engine thread.
  cuda::ScopedLaunchConfig launch_scope(launch_config_of(o));
#endif
  device = o.device == "cpu" ? Device::cpu : o.device == "cuda" ? Device::cuda : (cuda_available() ? Device::cuda : Device::cpu);
  TS_CHECK(device == Device::cpu || cuda_available(), "--device cuda: no CUDA device available");
  io::ModelConfig cfg = io::load_config(o.model_dir);  // first: names a missing/bad model dir
  tokenizer = tok::Tokenizer::from_dir(o.model_dir);
  if (o.device == "auto" && device == Device::cuda && models::has_recurrent_layers(cfg)) {
    // Hybrid models have no CUDA path yet; an explicit --device cuda is a startup error.
    spdlog::warn("{}: recurrent (linear-attention) layers run on the CPU only: --device auto picks cpu", cfg.architecture);
    device = Device::cpu;
  }
  models::LoadOptions lo;
  lo.device = device;
  TS_CHECK(!models::has_recurrent_layers(cfg) || o.speculative_algorithm.empty(),
           "{}: --speculative-algorithm {} is not supported for models with recurrent (linear-attention) layers: "
           "rejected drafts would need the recurrent state rolled back",
           cfg.architecture, o.speculative_algorithm);
  if (!o.speculative_algorithm.empty()) lo.capture_layers = SpecWorker::capture_layers_for(o, cfg);
  // Otherwise the final residual stream is the capture (prompt_pass: /v1/embeddings); it costs
  // nothing unless a forward asks for it.
  else if (!models::has_recurrent_layers(cfg)) lo.capture_layers = {int(cfg.num_layers)};
  lo.replicate_embedding = o.replicate_embedding;
  TS_CHECK(o.tp_size >= 1, "--tp-size must be at least 1 (got {})", o.tp_size);
  const parallel::ParallelOptions po = engine_parallel_options(o);  // tp_workers.h
  if (po.dp_size > 1) {
    // Attention DP: one scheduler, requests placed in a DP group at admission, the KV cache
    // partitioned per group (kv_cache.h, model_runner.h). Built and tested on CPU ranks.
    TS_CHECK(device == Device::cpu, "--data-parallel-size {} runs on CPU ranks only so far (--device cpu)", po.dp_size);
    TS_CHECK(o.speculative_algorithm.empty(), "--data-parallel-size {}: --speculative-algorithm is not supported with "
             "attention data parallelism yet", po.dp_size);
    TS_CHECK(!models::has_recurrent_layers(cfg), "--data-parallel-size {}: {} keeps recurrent state per request, which "
             "attention data parallelism does not place per group yet", po.dp_size, cfg.architecture);
    TS_CHECK(po.nnodes == 1, "--data-parallel-size {}: not supported with --nnodes {} yet", po.dp_size, po.nnodes);
  }
  if (o.enable_deterministic_inference && device == Device::cuda) {
    // The batch-invariant kernels (linear.cu, fused.cu, quant_linear.cu, moe.cu, attention.cu,
    // latent_attention.cu; MiniMax-M3's block-sparse kernels are one block per row already)
    // cover every model CUDA runs; NCCL sums do not yet.
    TS_CHECK(po.world_size() == 1,
             "--enable-deterministic-inference with {} GPUs is not supported yet: NCCL's all-reduce picks its algorithm "
             "by message size, so a row's sum would depend on the batch (--device cpu ranks sum in rank order)",
             po.world_size());
  }
  if (o.enable_deterministic_inference)
    spdlog::info("deterministic inference: batch-invariant kernels ({})",
                 device == Device::cuda ? "one GEMM algorithm per shape, no GEMV / fused decode kernels, "
                                          "fixed-split attention"
                                        : "the CPU backend's own");
  TpModels tpm;
  if (po.world_size() > 1) {  // one shard per rank (GPUs or CPU threads), tp_workers.h
    tpm = load_tp_models(cfg, lo, po);
    model = tpm.shards[0];
  } else {
    model = models::create_model(cfg, lo);
  }
  const bool hybrid = model->state_spec().any();
  // KV pool: explicit token count, else a share of memory.
  kv_dtype = ModelRunner::check_kv_dtype(o.kv_cache_dtype, *model);
  size_t per_token = ModelRunner::kv_bytes_per_token(*model, kv_dtype);
  int64_t tokens = o.max_total_tokens;
  if (tokens <= 0) {
    if (device == Device::cpu) {
      double frac = o.mem_fraction_static > 0 ? o.mem_fraction_static : 0.05;
      size_t budget = size_t(frac * 24.0 * (1ull << 30));  // share of a 24 GiB host
      tokens = int64_t(budget / per_token);
      tokens = std::min<int64_t>(tokens, 64 * cfg.max_position_embeddings);
    } else {
#ifdef TS_WITH_CUDA
      double frac = o.mem_fraction_static > 0 ? o.mem_fraction_static : 0.85;
      device_empty_cache();  // blocks cached during loading count as free memory here
      size_t total = cuda::total_memory(), free = cuda::free_memory();
      size_t reserve = size_t((1.0 - frac) * double(total));
      TS_CHECK(free > reserve + (256ull << 20), "not enough GPU memory for a KV pool: {} MiB free, {} MiB reserved", free >> 20, reserve >> 20);
      tokens = int64_t((free - reserve) / per_token);
#endif
    }
  }
  int bs = o.block_size;
  TS_CHECK(bs > 0 && bs <= 1024, "--block-size must be in 1..1024 (got {})", bs);
  int64_t blocks = std::max<int64_t>(tokens / bs, 1);
  // Under TP every GPU holds its shard of the weights and of the KV heads; the pool size in
  // tokens comes from GPU 0 (the shards are the same size) and is the same on every GPU.
  // Hybrid models: one recurrent-state row per running request. Rows of a large model are big
  // (tens to hundreds of MiB), so the rows, and with them --max-num-seqs, are capped at 4 GiB.
  int max_seqs = std::max(o.max_num_seqs, 1);
  if (hybrid) {
    const size_t per_slot = model->state_spec().bytes_per_slot(model->dtype()), cap = 4ull << 30;
    if (per_slot * size_t(max_seqs) > cap) {
      max_seqs = int(std::max<size_t>(1, cap / per_slot));
      spdlog::warn("recurrent state takes {:.1f} MiB per request: --max-num-seqs lowered from {} to {}",
                   double(per_slot) / (1 << 20), o.max_num_seqs, max_seqs);
    }
  }
  runner = tpm.workers ? make_tp_runner(tpm, blocks, bs, max_seqs, kv_dtype)
                       : std::make_unique<ModelRunner>(model, blocks, bs, max_seqs, kv_dtype);
  if (kv_dtype != model->dtype())
    spdlog::info("KV cache: {} ({} bytes per token, {} for {})", dtype_name(kv_dtype), per_token,
                 ModelRunner::kv_bytes_per_token(*model), dtype_name(model->dtype()));
  if (po.nnodes > 1) start_nodes(po, cfg, blocks, bs, max_seqs);
  // Cached KV blocks cannot restore a recurrent layer's state at the end of the prefix.
  bool prefix_cache = !o.disable_prefix_cache;
  if (hybrid && prefix_cache) {
    prefix_cache = false;
    spdlog::info("prefix cache off: {} has recurrent (linear-attention) layers whose state cannot be restored from "
                 "cached blocks",
                 cfg.architecture);
  }
  if (hybrid)
    spdlog::info("recurrent state: {} slots, {:.1f} MiB", runner->state_pool().size(),
                 double(runner->state_bytes()) / (1 << 20));
  // Attention DP: every rank's pool has `blocks` blocks of its group; the cache hands out ids of
  // all groups (a request's context still fits in one group's blocks).
  kv = std::make_unique<KvCache>(blocks * po.dp_size, bs, prefix_cache, po.dp_size);
  // Every layer slides (Mistral): blocks below the window are released as sequences advance,
  // so a context longer than the pool runs (vLLM's sliding-window manager). Not with EAGLE3:
  // its draft layer attends to the whole context through the same table.
  const bool all_slide = cfg.sliding_window > 0 && int64_t(cfg.sliding_layers.size()) == cfg.num_layers &&
                         std::all_of(cfg.sliding_layers.begin(), cfg.sliding_layers.end(), [](uint8_t s) { return s != 0; });
  if (all_slide && o.speculative_algorithm.empty()) {
    kv->set_window_release(int(cfg.sliding_window));
    spdlog::info("KV cache: every layer attends to the last {} tokens: blocks below that are released as "
                 "sequences advance",
                 cfg.sliding_window);
  }
  SchedulerOptions so;
  so.token_budget = std::max(o.chunked_prefill_size, 1);
  so.max_num_seqs = max_seqs;
  if (o.enable_mixed_batch) {
    TS_CHECK(o.mixed_prefill_tokens >= 0, "--mixed-prefill-tokens must be 0 (automatic) or positive (got {})",
             o.mixed_prefill_tokens);
    TS_CHECK(o.mixed_step_factor > 1.0 && o.mixed_step_factor <= 100.0, "--mixed-step-factor must be in (1, 100] (got {})",
             o.mixed_step_factor);
    so.mixed_prefill_tokens = o.mixed_prefill_tokens;
    if (o.mixed_prefill_tokens == 0) {
      MixedBudgetOptions mo;
      mo.factor = o.mixed_step_factor;
      mo.max_tokens = so.token_budget;
      mo.min_tokens = std::min(64, so.token_budget);
      mo.initial = std::min(512, so.token_budget);
      TS_CHECK(o.mixed_min_chunk >= 0, "--mixed-min-chunk must be >= 0 (got {})", o.mixed_min_chunk);
      mo.efficient_tokens = std::min(o.mixed_min_chunk, so.token_budget);
      TS_CHECK(o.mixed_align_tokens >= 0, "--mixed-align-tokens must be >= 0 (got {})", o.mixed_align_tokens);
      mo.align_tokens = o.mixed_align_tokens;
      mixed_budget_ = std::make_unique<MixedBudget>(mo);
    }
  }
  if (!o.speculative_algorithm.empty()) {
    spec = std::make_unique<SpecWorker>(o, *runner);
    so.decode_tokens = spec->num_draft_tokens();
    worker = spec.get();
  } else {
    plain = std::make_unique<PlainWorker>(*runner);
    worker = plain.get();
  }
  start_kvstore(o);
  sched = std::make_unique<Scheduler>(*kv, so);
  sched->set_mixed_budget(mixed_budget_.get());
  // Grammar mask rows (runtime/token_mask.h): one per request that can sample in a step, made
  // before the decode graphs capture the buffer.
  if (plain) runner->token_mask(max_seqs);
  context_len = o.context_length > 0 ? std::min(o.context_length, cfg.max_position_embeddings) : cfg.max_position_embeddings;
  // The pool caps it, unless a window release keeps any context's blocks within the pool.
  if (kv->window_release() == 0 ||
      kv->peak_blocks(context_len + so.decode_tokens, std::max(so.token_budget, so.decode_tokens) + so.extra_decode_slots) >
          kv->group_blocks())
    context_len = std::min<int64_t>(context_len, blocks * bs - so.decode_tokens);
  start_graphs(o, so);  // (its decode graphs' table width from context_len)
  // Overlap scheduling for the plain worker; the EAGLE3 worker keeps the simple loop (its
  // drafts and acceptance need the previous step's ids on the host before it is planned).
  overlap_ = !o.disable_overlap_schedule && plain;
  // Device logits processing state now (graphs made it already): created lazily it would appear
  // while the device thread reads it.
  if (plain && device == Device::cuda) runner->logits_proc();
  if (device == Device::cuda) sync_clock_.use_device_events();
  if (overlap_) thread_steps_ = std::make_unique<StepThread>(*plain, *runner, device == Device::cuda);
  io::GenerationConfig gc = io::load_generation_config(o.model_dir);
  for (auto id : cfg.eos_token_ids) eos.insert(id);
  for (auto id : gc.eos_token_ids) eos.insert(id);
  if (auto e = tokenizer->eos_id()) eos.insert(*e);
  metrics_.kv_total_blocks = kv->num_blocks();
  metrics_.device_idle_gap_s = Histogram({1e-5, 3e-5, 1e-4, 3e-4, 1e-3, 3e-3, 1e-2, 3e-2, 0.1});
  metrics_.ttft_s = Histogram({0.001, 0.005, 0.01, 0.02, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60});
  metrics_.itl_s = Histogram({0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.25, 0.5, 1});
  metrics_.e2e_s = Histogram({0.01, 0.05, 0.1, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300});
  for (Histogram* h : {&metrics_.queue_s, &metrics_.prefill_s, &metrics_.decode_s})
    *h = Histogram({0.001, 0.005, 0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300});
  metrics_.block_size = bs;
  if (store) metrics_.kvstore_total_blocks = store->num_blocks();
  spdlog::info("engine: {} on {}, {} layers, KV pool {} blocks x {} tokens ({:.1f} MiB), context {}", cfg.architecture,
               device_name(device), cfg.num_layers, blocks, bs, double(blocks * bs * per_token) / (1 << 20), context_len);
}

// The host tier: mirrors of the target pool (and the EAGLE3 draft pool), sized against the
// host memory free now. Off without the prefix cache (nothing would ever hit). Under TP every
// rank's pool holds its own KV-head shard under the same block ids, so the one bookkeeping
// (hashes, host LRU) serves all ranks; each rank's shard gets its own host mirrors and its
// copies run on the rank's thread (CUDA: on its GPU's copy streams).
void EngineImpl::start_kvstore(const EngineOptions& o) {
  if (o.kv_events) kv->enable_events();
  if (o.disable_kvstore || !kv->prefix_cache_enabled()) return;
  const int ranks = runner->tp_size();
  if (nnodes > 1) {
    spdlog::warn("kvstore: the host KV tier does not support --nnodes {} yet; running without it", nnodes);
    return;
  }
  if (kv->groups() > 1) {
    spdlog::warn("kvstore: the host KV tier does not support --data-parallel-size {} yet; running without it",
                 kv->groups());
    return;
  }
  TS_CHECK(o.kvstore_ratio >= 0 && o.kvstore_size_gb >= 0, "--kvstore-ratio and --kvstore-size must not be negative");
  size_t per_block = ModelRunner::kv_bytes_per_token(*model, kv_dtype) * size_t(kv->block_size()) * size_t(ranks);
  if (spec) per_block += spec->draft_kv().k.empty() ? 0 : spec->draft_kv().k[0].nbytes() / size_t(kv->num_blocks()) * 2;
  size_t avail = 0;
  int64_t n = kvstore_blocks(kv->num_blocks(), per_block, o.kvstore_ratio, o.kvstore_size_gb, avail);
  if (n <= 0) {
    spdlog::info("kvstore: off (size 0)");
    return;
  }
  store = std::make_unique<KvStore>(n, kv->block_size());
  for (int r = 0; r < ranks; ++r) store->attach(runner->peer(r)->kv(), r);  // rank r's KV-head shard
  if (spec) store->attach(spec->draft_kv(), 0);
  if (ranks > 1) store->set_rank_runner([w = runner->tp_workers()](const std::function<void(int)>& fn) { w->run(fn); });
  store->set_load_delay_polls(o.kvstore_test_load_delay_polls);
  TS_CHECK(o.kvstore_write_policy == "write_through" || o.kvstore_write_policy == "write_back",
           "--kvstore-write-policy: write_through or write_back (got {})", o.kvstore_write_policy);
  store->set_write_through(o.kvstore_write_policy == "write_through");
  kv->set_store(store.get());
  int64_t want = o.kvstore_size_gb > 0 ? int64_t(o.kvstore_size_gb * double(1ull << 30) / double(per_block))
                                       : int64_t(o.kvstore_ratio * double(kv->num_blocks()));
  spdlog::info("kvstore: host KV tier {} blocks x {} tokens ({:.1f} MiB{}, {:.2f}x the device pool{}, {}); {:.1f} GiB "
               "host memory available",
               n, kv->block_size(), double(store->host_bytes()) / (1 << 20),
               ranks > 1 ? fmt::format(", {} rank shards", ranks) : std::string(), double(n) / double(kv->num_blocks()),
               n < want ? ", capped at half the available memory" : "", o.kvstore_write_policy,
               double(avail) / double(1ull << 30));
}

void EngineImpl::publish_kv_events() {
  if (!kv->events_enabled()) return;
  kv_events_.clear();
  kv->drain_events(kv_events_);
  if (kv_events_.empty() || !kv_event_sink) return;
  kv_event_sink(kv_events_);
}

void EngineImpl::start_nodes(const parallel::ParallelOptions& po, const io::ModelConfig& cfg, int64_t blocks, int bs,
                             int max_seqs) {
  nnodes = po.nnodes;
  node_rank = po.node_rank;
  TS_CHECK(opts.speculative_algorithm.empty(), "--nnodes {}: --speculative-algorithm is not supported across nodes yet",
           po.nnodes);
  // What every node must agree on for the same step to run the same forward on each.
  const std::string fp = fmt::format(
      "{} layers={} hidden={} vocab={} device={} tp={} dp={} dense_tp={} moe_tp={} ep={} nnodes={} kv_blocks={} "
      "block_size={} state_slots={} replicate_embedding={} kv_dtype={}",
      cfg.architecture, cfg.num_layers, cfg.hidden_size, cfg.vocab_size, device_name(device), po.attention_tp(),
      po.dp_size, po.dense_tp_size, po.moe_tp_size, po.ep_size, po.nnodes, blocks, bs, max_seqs,
      po.replicate_embedding, dtype_name(kv_dtype));
  if (po.node_rank == 0) {
    step_channel = StepChannel::serve(po, fp);
    runner->set_step_channel(step_channel);
  } else {
    step_channel = StepChannel::join(po, fp);
  }
}

void EngineImpl::start_graphs(const EngineOptions& o, const SchedulerOptions& so) {
  if (device != Device::cuda) return;
  if (nnodes > 1) {  // the worker nodes would have to capture and replay alongside: not built
    spdlog::warn("--nnodes {}: CUDA graphs off (eager steps)", nnodes);
    return;
  }
  if (o.enforce_eager || (o.disable_cuda_graph && o.disable_prefill_graph)) return;
  GraphOptions g;
  g.decode = !o.disable_cuda_graph;
  g.prefill = !o.disable_prefill_graph;
  g.max_bs = std::min(o.cuda_graph_max_bs, so.max_num_seqs);
  g.max_prefill_tokens = o.prefill_graph_max_tokens;
  // A window release lets a sequence's table outgrow the pool (its early entries released).
  g.max_context = int(std::min<int64_t>(model->config().max_position_embeddings,
                                        kv->window_release() > 0 ? context_len + so.decode_tokens
                                                                 : kv->num_blocks() * kv->block_size()));
  g.eager_max_tokens = so.token_budget + so.max_num_seqs * so.decode_tokens;
  g.capture_aux = spec != nullptr;
  if (spec) spec->size_for_graphs(g);
  runner->enable_graphs(g);
  if (spec) spec->enable_graphs(g);  // the EAGLE3 decode step: draft loop + verify + catch-up
}

void EngineImpl::stop() {
  {
    std::lock_guard<std::mutex> lk(mu_);
    stopping_ = true;
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
}

std::shared_ptr<Stream> EngineImpl::submit(GenerateParams p) {
  if (p.prompt.empty()) throw InvalidRequest("the prompt is empty", "prompt");
  int64_t vocab = model->config().vocab_size;
  for (int32_t t : p.prompt)
    if (t < 0 || t >= vocab)
      throw InvalidRequest(fmt::format("token id {} is outside the vocabulary (0..{})", t, vocab - 1), "prompt");
  if (p.max_tokens <= 0) throw InvalidRequest("max_tokens must be at least 1", "max_tokens");
  if (int64_t(p.prompt.size()) + p.max_tokens > context_len)
    throw InvalidRequest(fmt::format("This model's maximum context length is {} tokens. However, you requested {} tokens "
                                     "({} in the prompt, {} for the completion).",
                                     context_len, p.prompt.size() + size_t(p.max_tokens), p.prompt.size(), p.max_tokens),
                         "max_tokens");
  // Structured outputs / logit_bias / min_tokens (runtime/structured.h) also hold under EAGLE3:
  // the speculative worker masks each verify position with the grammar state after the drafts
  // before it (SpecWorker::accept; requests with constraints accept on the host).
  // Jump-forward: not under EAGLE3 (its verify rows are one token per step and position), nor
  // with --disable-jump-forward.
  if (spec || opts.disable_jump_forward) p.jump_forward = false;
  std::vector<std::vector<int32_t>> bad_words = bad_word_ids(*tokenizer, p.bad_words);
  if (spec)
    for (auto& w : bad_words)
      if (w.size() > 1)
        throw InvalidRequest("'bad_words' of more than one token are not supported with speculative decoding (the draft "
                             "and verify steps ban one-token words only)",
                             "bad_words");
  auto r = std::make_shared<Request>();
  r->constraints = LogitsConstraints::make(p, std::vector<int32_t>(eos.begin(), eos.end()), std::move(bad_words));
  r->stream = std::make_shared<Stream>();
  r->tokens = p.prompt;
  r->prompt_len = int(p.prompt.size());
  r->submitted = Clock::now();
  {
    std::lock_guard<std::mutex> lk(mu_);
    r->id = next_id_++;
    r->seed = p.seed ? *p.seed : seed_rng_();
    r->params = std::move(p);
    incoming_.push_back(r);
  }
  cv_.notify_one();
  return r->stream;
}

void EngineImpl::intake() {
  std::vector<std::shared_ptr<Request>> in;
  std::vector<std::function<void(bool)>> passes;
  {
    std::unique_lock<std::mutex> lk(mu_);
    if (incoming_.empty() && passes_.empty() && jump_wait_.empty() && sched->idle() && inflight_ < 0 && !stopping_) {
      cv_.wait_for(lk, std::chrono::milliseconds(100));
      was_idle_ = true;
    }
    in.swap(incoming_);
    passes.swap(passes_);
  }
  // A prompt pass (embeddings, prompt logprobs) runs its own forwards on the runner and the KV
  // pool: never while an overlapped step is in flight.
  if (!passes.empty()) drain();
  for (auto& run : passes) run(true);
  if (!passes.empty()) loop_c0_ = thread_cpu_us();  // the passes' forwards are not a step's host time
  if (!in.empty()) {
    std::lock_guard<std::mutex> lk(metrics_mu_);
    metrics_.requests_total += int64_t(in.size());
  }
  // Jump-forward before the first token: a grammar that forces its first bytes (`{"name":"`)
  // has them in the request before it is admitted, so its prefill computes them. The decision
  // is a mask-thread job; a request waits here (not admitted) while it is not made, unless the
  // engine has nothing else to do.
  in.insert(in.begin(), jump_wait_.begin(), jump_wait_.end());
  jump_wait_.clear();
  for (auto& r : in) {
    if (r->constraints && r->constraints->jumps() && !r->stream->cancelled()) {
      if (!r->constraints->forced_ready() && !(sched->idle() && inflight_ < 0)) {
        jump_wait_.push_back(r);
        continue;
      }
      StreamEvent ev;
      if (jump(*r, ev) != FinishReason::none) {  // a stop id among the forced tokens: done
        finish(*r, FinishReason::stop, ev);
        continue;
      }
      emit(*r, ev);
    }
    sched->add(r);
  }
  // Clients that went away: abort wherever the request is. Clients that matched a stop
  // string themselves: finish it as stopped.
  auto check = [&](const std::shared_ptr<Request>& r) {
    if (r->terminal()) return;
    if (r->stream->cancelled()) {
      r->abort("client disconnected");
      StreamEvent ev;
      finish(*r, FinishReason::abort, ev);
    } else if (r->stream->stop_requested()) {
      if (r->is<state::Waiting>() || r->is<state::Retracted>()) r->abort("stopped by the client before it ran");
      StreamEvent ev;
      finish(*r, FinishReason::stop, ev);
    }
  };
  // A step's first pass over the running requests: their lines (and streams) are fetched 4
  // ahead -- the forward since the last step evicted them; the passes after this one find them
  // cached (overlap_ok does the same where this one found nothing to do).
  const auto& running = sched->running();
  for (size_t k = 0; k < std::min<size_t>(running.size(), 4); ++k) prefetch_step_lines(running[k].get());
  for (size_t k = 0; k < running.size(); ++k) {
    if (k + 4 < running.size()) prefetch_step_lines(running[k + 4].get());
    if (k + 2 < running.size() && running[k + 2]->stream) running[k + 2]->stream->prefetch();
    check(running[k]);
  }
  for (auto& r : sched->waiting()) check(r);
  sched->reap();
  refresh_gauges();
}

void EngineImpl::refresh_gauges() {
  std::lock_guard<std::mutex> lk(metrics_mu_);
  metrics_.running = int(sched->running().size());
  metrics_.waiting = int(sched->waiting().size());
  metrics_.kv_used_blocks = kv->used_blocks();
  metrics_.kv_usage = double(kv->used_blocks()) / double(kv->num_blocks());
  metrics_.prefix_device_hit_tokens = kv->device_hit_tokens();
  metrics_.prefix_host_hit_tokens = kv->host_hit_tokens();
  metrics_.prefix_host_hit_blocks = kv->host_hit_blocks();
  if (store) {
    const KvStoreStats& st = store->stats();
    metrics_.kvstore_used_blocks = store->cached_blocks();
    metrics_.kvstore_writeback_blocks = st.writeback_blocks;
    metrics_.kvstore_bytes_written = st.bytes_written;
    metrics_.kvstore_bytes_loaded = st.bytes_loaded;
    metrics_.kvstore_load_seconds = st.load_seconds;
    metrics_.kvstore_load_batches = st.load_batches;
    metrics_.kvstore_loaded_bytes_done = st.loaded_bytes_done;
    metrics_.kvstore_staged_steps = staged_steps_;
  }
}

void EngineImpl::loop() {
#ifdef TS_WITH_CUDA
  cuda::set_launch_config(launch_config_of(opts));
#endif
  while (true) {
    {
      std::lock_guard<std::mutex> lk(mu_);
      if (stopping_) break;
    }
    try {
      loop_c0_ = thread_cpu_us();
      intake();
      if (!sched->idle()) step();
      else drain();
      outbox_.flush();
    } catch (const std::exception& e) {
      // A failed step fails the requests in it; the engine keeps serving.
      spdlog::error("engine step failed: {}", e.what());
      close_constraints();  // the step in flight may wait for masks that never come
      if (inflight_ >= 0) {
        try {
          thread_steps_->wait(inflight_);
        } catch (...) {
        }
        keep_[inflight_].clear();
        inflight_ = -1;
      }
      for (auto& r : sched->running()) fail_request(*r, e.what());
      sched->reap();
      outbox_.flush();
    }
  }
  try {
    drain();
  } catch (...) {
  }
  for (auto& r : sched->running()) fail_request(*r, "server shutting down");
  for (auto& r : sched->waiting()) fail_request(*r, "server shutting down");
  for (auto& r : jump_wait_) fail_request(*r, "server shutting down");
  jump_wait_.clear();
  outbox_.flush();
  std::lock_guard<std::mutex> lk(mu_);
  for (auto& run : passes_) run(false);
  passes_.clear();
}

PromptPassResult EngineImpl::prompt_pass(PromptPassRequest req) {
  if (req.ids.empty()) throw InvalidRequest("the prompt is empty", "input");
  int64_t vocab = model->config().vocab_size;
  for (int32_t t : req.ids)
    if (t < 0 || t >= vocab)
      throw InvalidRequest(fmt::format("token id {} is outside the vocabulary (0..{})", t, vocab - 1), "input");
  if (int64_t(req.ids.size()) > context_len)
    throw InvalidRequest(fmt::format("This model's maximum context length is {} tokens; the input has {}", context_len,
                                     req.ids.size()),
                         "input");
  auto done = std::make_shared<std::promise<PromptPassResult>>();
  auto fut = done->get_future();
  // Logprob passes keep a [chunk, vocab] f32 logits block on the host: bound it to ~256 MiB.
  int chunk = std::max(1, opts.chunked_prefill_size);
  if (req.logprobs >= 0) chunk = int(std::clamp<int64_t>((int64_t(256) << 20) / (4 * std::max<int64_t>(vocab, 1)), 1, chunk));
  {
    std::lock_guard<std::mutex> lk(mu_);
    if (stopping_) throw Error("the engine is shutting down");
    passes_.push_back([this, done, req = std::move(req), chunk](bool run) {
      PromptPassResult r;
      if (!run) {
        r.error = "server shutting down";
      } else {
        try {
          r = run_prompt_pass(*runner, *kv, req, chunk);
        } catch (const std::exception& e) {
          r.error = e.what();
        }
        refresh_gauges();
      }
      done->set_value(std::move(r));
    });
  }
  cv_.notify_one();
  return fut.get();
}

void EngineImpl::close_constraints() {
  for (auto* list : {&keep_[0], &keep_[1], &sched->running()})
    for (auto& r : *list)
      if (r->constraints) r->constraints->close();
  for (auto& r : sched->waiting())
    if (r->constraints) r->constraints->close();
}

void EngineImpl::fail_request(Request& r, const std::string& msg) {
  if (r.terminal()) return;
  r.abort(msg);
  StreamEvent ev;
  ev.error = msg;
  finish(r, FinishReason::abort, ev);
}

void EngineImpl::step() {
  if (overlap_ && overlap_ok()) return step_overlap();
  drain();
  step_sync();
}

bool EngineImpl::overlap_ok() {
  // Steps of requests that need host logits (penalties read the history) run in the simple
  // loop; so does everything once such a request is running or waiting. A request that will
  // take a device logits slot when planned (apply_plan) overlaps, if every such request finds
  // a free slot.
  int want_slots = 0;
  auto ok = [&](const Request& r) {
    if (r.terminal() || PlainWorker::can_overlap(r)) return true;
    if (r.logits_slot || !DeviceLogits::supported(r) || !runner->logits_proc_if_any()) return false;
    ++want_slots;
    return true;
  };
  // Lines fetched 4 ahead, as in intake (a step's first pass when it ran nothing).
  const auto& running = sched->running();
  for (size_t k = 0; k < std::min<size_t>(running.size(), 4); ++k) prefetch_step_lines(running[k].get());
  for (size_t k = 0; k < running.size(); ++k) {
    if (k + 4 < running.size()) prefetch_step_lines(running[k + 4].get());
    if (!ok(*running[k])) return false;
  }
  for (auto& r : sched->waiting())
    if (!ok(*r)) return false;
  return want_slots == 0 || want_slots <= runner->logits_proc_if_any()->free_slots();
}

void EngineImpl::step_sync() {
  const double c0 = loop_c0_;
  sched->plan(plan_);
  apply_plan(plan_);
  // Host-tier copies first: writebacks read blocks this step overwrites (the forward waits for
  // them); loads fill blocks of requests this plan does not run (staged: they run once the
  // load has landed), also when the plan has no rows.
  if (store && !plan_.kv_ops.empty()) store->execute(plan_.kv_ops);
  publish_kv_events();
  if (plan_.empty()) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));  // e.g. only loads in flight
    return;
  }
  if (plan_.kv_loading > 0) ++staged_steps_;
  const double c1 = thread_cpu_us();
  auto t1 = Clock::now();
  runner->set_step_listener(spec ? nullptr : &sync_clock_);
  sync_clock_.begin(!spec);
  const bool fresh = was_idle_;
  was_idle_ = false;
  try {
    worker->execute(plan_, result_);
  } catch (...) {
    sync_clock_.failed();
    throw;
  }
  sync_clock_.end(fresh, result_);
  auto t2 = Clock::now();
  const double c2 = thread_cpu_us();
  apply(plan_, result_);
  sched->reap();
  refresh_gauges();
  outbox_.flush();
  const double c3 = thread_cpu_us();
  // Plan and apply: this thread's CPU time (as in step_overlap). The worker runs here, on the
  // device or the CPU: its host share is its wall time less the forward's.
  const double fwd_us = result_.forward_s * 1e6, copy_us = inline_copy_us();
  part_us_[0] = std::max(0.0, c1 - c0 - copy_us);
  part_us_[1] = std::max(0.0, secs(t2 - t1) * 1e6 - fwd_us);
  part_us_[2] = c3 - c2;
  observe_idle(plan_, result_, false);
  observe_cost(plan_, result_);
  update_metrics(part_us_[0] + part_us_[1] + part_us_[2]);
}

bool EngineImpl::drain() {
  if (inflight_ < 0) return false;
  const int s = inflight_;
  inflight_ = -1;
  thread_steps_->wait(s);
  apply_overlapped(s);
  keep_[s].clear();
  sched->reap();
  refresh_gauges();
  observe_idle(plans_[s], thread_steps_->result[s], launched_behind_[s]);
  observe_cost(plans_[s], thread_steps_->result[s]);
  return true;
}

void EngineImpl::step_overlap() {
  const double c0 = loop_c0_;
  const int cur = next_slot_;
  StepPlan& plan = plans_[cur];
  sched->plan(plan);
  apply_plan(plan);
  if (store && !plan.kv_ops.empty()) {
    // Evictions' writebacks and loads touch device blocks the step in flight may still write
    // (a block freed by an abort meanwhile): they are issued once it is done (its writes land
    // first, as in the simple loop), before this plan is launched; the loads then run beside
    // the steps. Write-throughs read committed blocks, which no step writes: no wait, except
    // under TP, where the copies are issued on the ranks' threads, busy with the step in flight.
    if (inflight_ >= 0 && (plan.kv_ops.needs_drain() || store->ranks() > 1)) thread_steps_->wait(inflight_);
    store->execute(plan.kv_ops);
  }
  publish_kv_events();
  if (plan.empty()) {
    // Nothing new to run: the step in flight (if any) may unblock something.
    if (!drain()) std::this_thread::sleep_for(std::chrono::milliseconds(1));
    return;
  }
  if (plan.kv_loading > 0) ++staged_steps_;
  plain->stage(plan, thread_steps_->staged[cur]);
  pre_apply(plan, cur);
  keep_[cur].assign(sched->running().begin(), sched->running().end());
  const double c1 = thread_cpu_us();
  const int prev = inflight_;
  thread_steps_->launch(cur, prev, was_idle_);
  launched_behind_[cur] = prev >= 0;
  was_idle_ = false;
  inflight_ = cur;
  next_slot_ = cur ^ 1;
  if (prev >= 0) {
    thread_steps_->wait(prev);
    apply_overlapped(prev);
    keep_[prev].clear();
    const StepResult& res = thread_steps_->result[prev];
    observe_idle(plans_[prev], res, launched_behind_[prev]);
    observe_cost(plans_[prev], res);
    part_us_[1] = 0;  // the worker's host share runs on its own thread
    std::lock_guard<std::mutex> lk(metrics_mu_);
    ++metrics_.overlap_steps;
  }
  sched->reap();
  refresh_gauges();
  outbox_.flush();  // (also at the loop's end; here so the host time counts the wakes)
  const double c3 = thread_cpu_us(), copy_us = inline_copy_us();
  part_us_[0] = std::max(0.0, c1 - c0 - copy_us);
  part_us_[2] = c3 - c1;
  // Engine host time: the engine thread's CPU time (waiting for the device thread takes none),
  // less the CPU backend's host-tier copies, its device work.
  update_metrics(std::max(0.0, c3 - c0 - copy_us));
}

void EngineImpl::pre_apply(StepPlan& plan, int slot) {
  std::vector<size_t>& pos = future_pos_[slot];
  pos.assign(plan.chunks.size(), SIZE_MAX);
  for (size_t k = 0; k < plan.chunks.size(); ++k) {
    Request& r = *plan.chunks[k].req;
    const bool last = r.num_computed + plan.chunks[k].num_tokens == int(r.tokens.size());
    r.num_computed += plan.chunks[k].num_tokens;
    if (!last) continue;
    pos[k] = r.tokens.size();
    r.tokens.push_back(-int32_t(k + 1));
    if (r.is<state::Prefilling>()) r.transit<state::Prefilling>(state::Decoding{});
    if (r.num_generated() >= r.params.max_tokens || int64_t(r.tokens.size()) >= context_len) r.finishing = true;
  }
}

void EngineImpl::apply_overlapped(int slot) {
  StepPlan& plan = plans_[slot];
  const StepResult& res = thread_steps_->result[slot];
  const std::vector<size_t>& pos = future_pos_[slot];
  const auto now = Clock::now();
  itl_.clear();
  // The forward of the step just launched runs beside this loop and evicts the requests: their
  // lines are fetched kLinesAhead rows ahead, their token slot and stream kSlotsAhead rows ahead
  // (reading the then-cached tokens pointer), so the rows' misses overlap.
  constexpr size_t kLinesAhead = 4, kSlotsAhead = 2;
  const size_t n = plan.chunks.size();
  for (size_t k = 0; k < std::min(n, kLinesAhead); ++k) prefetch_step_lines(plan.chunks[k].req.get());
  for (size_t k = 0; k < n; ++k) {
    if (k + kLinesAhead < n) prefetch_step_lines(plan.chunks[k + kLinesAhead].req.get());
    if (k + kSlotsAhead < n && pos[k + kSlotsAhead] != SIZE_MAX) {
      const Request& a = *plan.chunks[k + kSlotsAhead].req;
      if (pos[k + kSlotsAhead] < a.tokens.size()) __builtin_prefetch(a.tokens.data() + pos[k + kSlotsAhead]);
      if (a.stream) a.stream->prefetch();
    }
    Request& r = *plan.chunks[k].req;
    if (r.terminal()) continue;  // aborted, or ended by the step before (its row here is waste)
    const RowResult& row = res.rows[k];
    if (row.count == 0) {
      kv->commit(r.tokens.data(), r.num_computed, r.block_table, r.block_hashes);
      continue;
    }
    if (r.future_voided) {  // jump-forward replaced this row's token: only its KV stays
      r.future_voided = false;
      if (!r.is<state::Waiting>()) kv->commit(r.tokens.data(), r.num_computed, r.block_table, r.block_hashes);
      continue;
    }
    const size_t p = pos[k];
    TS_CHECK(p < r.tokens.size() && r.tokens[p] == -int32_t(k + 1), "request {}: future id of row {} lost", r.id, k);
    const int32_t t = res.tokens[size_t(row.first)];
    r.tokens[p] = t;
    StreamEvent& ev = row_event();
    observe_token_time(r, ev, now);
    ev.tokens.push_back(t);
    const FinishReason why = stop_reason(r, t, p);
    if (why != FinishReason::none) {
      if (r.has_future()) r.tokens.pop_back();  // the next step's future: it will not be applied
      finish(r, why, ev);  // (its blocks are committed when it is reaped, as in the simple loop)
      continue;
    }
    // Positions below num_computed hold known ids now (the next future, if any, is at num_computed).
    if (!r.is<state::Waiting>()) kv->commit(r.tokens.data(), r.num_computed, r.block_table, r.block_hashes);
    emit_or_jump(r, ev);
  }
  apply_jumps();
  if (!itl_.empty()) {
    std::lock_guard<std::mutex> lk(metrics_mu_);
    for (double v : itl_) metrics_.itl_s.observe(v);
  }
}

void EngineImpl::emit_or_jump(Request& r, StreamEvent& ev) {
  if (!r.constraints || !r.constraints->jumps()) return emit(r, ev);
  jumps_.emplace_back(&r, std::move(ev));
  ev = StreamEvent{};
}

void EngineImpl::apply_jumps() {
  for (auto& [r, ev] : jumps_) {
    const FinishReason why = jump(*r, ev);
    if (why != FinishReason::none) finish(*r, why, ev);
    else emit(*r, ev);
  }
  jumps_.clear();
}

void EngineImpl::observe_idle(const StepPlan& plan, const StepResult& res, bool behind) {
  std::lock_guard<std::mutex> lk(metrics_mu_);
  metrics_.device_busy_seconds += res.busy_s;
  if (res.idle_before_s < 0) return;
  const double us = res.idle_before_s * 1e6;
  idle_us_ewma_ = idle_counted_ == 0 ? us : 0.95 * idle_us_ewma_ + 0.05 * us;
  ++idle_counted_;
  metrics_.device_idle_seconds += res.idle_before_s;
  metrics_.device_idle_us_mean = idle_us_ewma_;
  const size_t kind = step_kind(plan);
  metrics_.device_idle_seconds_by[kind][behind ? 0 : 1] += res.idle_before_s;
  metrics_.device_idle_gap_s.observe(res.idle_before_s);
}

// Room for the request's whole sequence, once it runs: its steps then append ids, blocks and
// block hashes without reallocating (the engine thread's decode steps allocate nothing). The
// generation part is capped (a 128k max_tokens would reserve 512 KiB of ids per request);
// beyond it the vectors grow by doubling as before.
void EngineImpl::reserve_for(Request& r) {
  constexpr int64_t kSlack = 64;                  // speculative lookahead, jump-forward tokens
  constexpr int64_t kMaxReservedGeneration = 16384;
  const int64_t want = std::min<int64_t>(int64_t(r.prompt_len) + std::min<int64_t>(r.params.max_tokens, kMaxReservedGeneration) + kSlack,
                                         context_len + kSlack);
  if (int64_t(r.tokens.capacity()) >= want) return;
  r.tokens.reserve(size_t(want));
  const size_t blocks = size_t((want + kv->block_size() - 1) / kv->block_size()) + 1;
  r.block_table.reserve(blocks);
  r.block_hashes.reserve(blocks);
}

void EngineImpl::apply_plan(StepPlan& plan) {
  apply_plan_transitions(plan);
  for (auto& r : plan.rejected)
    fail_request(*r, fmt::format("request needs {} tokens of KV cache; the pool holds {}", r->tokens.size(),
                                 kv->group_blocks() * kv->block_size()));
  // Worker-side handles, taken when a request first runs: its recurrent-state row (hybrid
  // models) and its worker slot (the EAGLE3 draft-state row).
  for (auto& c : plan.chunks) {
    Request& r = *c.req;
    reserve_for(r);
    if (runner->has_state() && !r.state_slot) r.state_slot = runner->take_state_slot();
    if (spec && !r.spec_slot) r.spec_slot = worker->acquire_slot();
    // Penalties / logit_bias / min_tokens on the device (runtime/device_logits.h; CUDA plain
    // worker): the slot is seeded from r.tokens with the step that first samples it.
    if (plain && !r.logits_slot && DeviceLogits::supported(r))
      if (DeviceLogits* dl = runner->logits_proc()) dl->acquire(r);
  }
}

void EngineImpl::apply(StepPlan& plan, const StepResult& res) {
  const auto now = Clock::now();
  itl_.clear();
  for (size_t k = 0; k < plan.chunks.size(); ++k) {
    Request& r = *plan.chunks[k].req;
    const RowResult& row = res.rows[k];
    if (row.accepted < 0) {  // a plain row (or a prefill chunk of a speculative step)
      r.num_computed += plan.chunks[k].num_tokens;
      kv->commit(r.tokens.data(), r.num_computed, r.block_table, r.block_hashes);
      if (row.count == 0) continue;  // mid-prefill chunk: nothing sampled
    }
    if (r.is<state::Prefilling>()) r.transit<state::Prefilling>(state::Decoding{});
    StreamEvent& ev = row_event();
    FinishReason why = FinishReason::none;
    int kept = 0;
    while (kept < row.count && why == FinishReason::none) {
      const TokenLogprob* lp = row.lp_first >= 0 ? &res.logprobs[size_t(row.lp_first + kept)] : nullptr;
      why = push_token(r, res.tokens[size_t(row.first + kept)], lp, ev, now);
      ++kept;
    }
    if (row.accepted >= 0) {
      // A verify row: the ids are the accepted drafts, then the bonus. Drafts after a stop
      // do not count; the verify wrote K/V for the last context token and the kept drafts.
      const int acc = std::min(kept, row.accepted);
      if (r.params.return_spec_trace)
        r.spec_trace.push_back({std::vector<int32_t>(res.drafts.begin() + row.draft_first,
                                                     res.drafts.begin() + row.draft_first + row.draft_count),
                                acc});
      r.num_computed += 1 + acc;
      ++spec_verify_steps_;
      spec_accepted_tokens_ += acc + 1;
      kv->commit(r.tokens.data(), r.num_computed, r.block_table, r.block_hashes);
    }
    if (why != FinishReason::none) finish(r, why, ev);
    else if (row.accepted < 0) emit_or_jump(r, ev);
    else emit(r, ev);
    if (spec) {
      if (r.terminal()) r.spec_slot.reset();
      else r.spec_next = row.spec_next;
    }
  }
  apply_jumps();
  if (!itl_.empty()) {
    std::lock_guard<std::mutex> lk(metrics_mu_);
    for (double v : itl_) metrics_.itl_s.observe(v);
  }
}

void EngineImpl::observe_token_time(Request& r, StreamEvent& ev, Clock::time_point now) {
  if (!r.has_first_token) {
    r.has_first_token = true;
    r.first_token = now;
    ev.ttft_s = secs(now - r.submitted);
  } else {
    itl_.push_back(secs(now - r.last_token));
  }
  r.last_token = now;
}

FinishReason EngineImpl::stop_reason(const Request& r, int32_t t, size_t pos) const {
  const GenerateParams& p = r.params;
  // Token-level stops only: stop strings are the consumer's (server::OutputProcessor), which
  // ends the request through Stream::request_stop.
  bool stop_id = (!p.ignore_eos && eos.count(t)) || std::find(p.stop_token_ids.begin(), p.stop_token_ids.end(), t) != p.stop_token_ids.end();
  if (stop_id) return FinishReason::stop;
  if (r.constraints) {  // the grammar state advances; a completed grammar ends the output
    r.constraints->accept(t);
    if (r.constraints->grammar_done() || r.constraints->failed()) return FinishReason::stop;
  }
  if (int64_t(pos) + 1 - r.prompt_len >= p.max_tokens || int64_t(pos) + 1 >= context_len) return FinishReason::length;
  return FinishReason::none;
}

FinishReason EngineImpl::push_token(Request& r, int32_t t, const TokenLogprob* lp, StreamEvent& ev,
                                    Clock::time_point now) {
  observe_token_time(r, ev, now);
  r.tokens.push_back(t);
  ev.tokens.push_back(t);
  if (lp) ev.logprobs.push_back(*lp);
  return stop_reason(r, t, r.tokens.size() - 1);
}

FinishReason EngineImpl::jump(Request& r, StreamEvent& ev) {
  if (!r.constraints || !r.constraints->jumps()) return FinishReason::none;
  r.constraints->take_forced(forced_);
  if (forced_.empty()) return FinishReason::none;
  if (r.has_future()) {
    // The step in flight samples after r's last token: the forced run takes the place of the id
    // it samples (dropped when it is applied); the K/V it computes for r's last token is kept.
    r.tokens.pop_back();
    r.future_voided = true;
  }
  const GenerateParams& p = r.params;
  for (int32_t t : forced_) {
    r.tokens.push_back(t);
    ev.tokens.push_back(t);
    if ((!p.ignore_eos && eos.count(t)) ||
        std::find(p.stop_token_ids.begin(), p.stop_token_ids.end(), t) != p.stop_token_ids.end())
      return FinishReason::stop;
  }
  return FinishReason::none;
}

void EngineImpl::finish(Request& r, FinishReason why, StreamEvent& ev) {
  if (r.constraints) r.constraints->close();  // nothing waits for its masks any more
  if (r.has_future()) {
    // Overlap: the id of the step in flight will not be applied. KV is claimed only for
    // known ids' positions below the last one, as the simple loop leaves it.
    r.tokens.pop_back();
    r.num_computed = std::min(r.num_computed, std::max(0, int(r.tokens.size()) - 1));
  }
  if (!r.terminal())
    r.transit<state::Waiting, state::Prefilling, state::Decoding>(state::Finished{why});
  ev.finished = true;
  ev.reason = why;
  for (auto& it : r.spec_trace) ev.spec_trace.emplace_back(it.drafts, it.accepted);
  {
    // Counted before the final event goes out: a client that reads /metrics after its
    // response sees its own request.
    std::lock_guard<std::mutex> lk(metrics_mu_);
    if (why == FinishReason::abort) ++metrics_.requests_aborted;
    else ++metrics_.requests_finished;
    metrics_.prompt_tokens += r.prompt_len;
    metrics_.cached_prompt_tokens += r.cached_tokens;
    metrics_.host_cached_prompt_tokens += r.host_cached_tokens;
    if (r.host_cached_tokens > 0 && r.has_first_token) {  // the TTFT of a host-tier hit, by phase
      const double queue = secs(r.scheduled - r.submitted), to_first = secs(r.first_token - r.scheduled);
      ++metrics_.kvstore_loaded_requests;
      metrics_.kvstore_loaded_queue_s += queue;
      metrics_.kvstore_loaded_load_s += std::min(r.kv_load_wait_s, to_first);
      metrics_.kvstore_loaded_prefill_s += std::max(0.0, to_first - r.kv_load_wait_s);
    }
    metrics_.generation_tokens += r.num_generated();
    if (r.has_first_token) {
      metrics_.ttft_s.observe(secs(r.first_token - r.submitted));
      auto end = Clock::now();
      metrics_.e2e_s.observe(secs(end - r.submitted));
      metrics_.queue_s.observe(secs(r.scheduled - r.submitted));
      metrics_.prefill_s.observe(secs(r.first_token - r.scheduled));
      metrics_.decode_s.observe(secs(end - r.first_token));
    }
  }
  emit(r, ev);
}

// Sends the ids new since the last event (text is the consumer's: StreamEvent).
void EngineImpl::emit(Request& r, StreamEvent& ev) {
  if (ev.tokens.empty() && !ev.finished) return;
  ev.prompt_tokens = r.prompt_len;
  ev.completion_tokens = r.num_generated_known();
  ev.cached_tokens = r.cached_tokens;
  r.tokens_emitted = r.num_generated_known();
  outbox_.push(r.stream, ev);  // the consumer is woken at the end of the step; ev comes back reset
}

void EngineImpl::update_metrics(double host_us) {
  host_us_ewma_ = metrics_.steps == 0 ? host_us : 0.95 * host_us_ewma_ + 0.05 * host_us;
  for (int i = 0; i < 3; ++i) part_ewma_[i] = metrics_.steps == 0 ? part_us_[i] : 0.95 * part_ewma_[i] + 0.05 * part_us_[i];
  std::lock_guard<std::mutex> lk(metrics_mu_);
  ++metrics_.steps;
  metrics_.step_host_us_mean = host_us_ewma_;
  metrics_.step_host_seconds += host_us * 1e-6;
  metrics_.step_plan_us_mean = part_ewma_[0];
  metrics_.step_worker_host_us_mean = part_ewma_[1];
  metrics_.step_apply_us_mean = part_ewma_[2];
  metrics_.prefix_hit_rate = metrics_.prompt_tokens ? double(metrics_.cached_prompt_tokens) / double(metrics_.prompt_tokens) : 0;
  metrics_.retractions = sched->retractions();
  metrics_.steps_by_kind = steps_by_kind_;
  metrics_.step_seconds_by_kind = step_seconds_by_kind_;
  metrics_.step_decode_rows = step_decode_rows_;
  metrics_.step_prefill_tokens = step_prefill_tokens_;
  if (spec) {
    metrics_.spec_verify_steps = spec_verify_steps_;
    metrics_.spec_accepted_tokens = spec_accepted_tokens_;
    metrics_.spec_fixed_steps = spec->fixed_steps();
    metrics_.spec_graph_steps = spec->graph_steps();
    metrics_.spec_timed_steps = spec->timed_steps();
    metrics_.spec_draft_seconds = spec->draft_seconds();
    metrics_.spec_verify_seconds = spec->verify_seconds();
    log_spec_stats();
  }
}

// At most every 30 s while speculating: mean accepted length and graph share since the last
// line (one clock read per step otherwise).
void EngineImpl::log_spec_stats() {
  auto now = Clock::now();
  if (now - spec_log_.at < std::chrono::seconds(30)) return;
  int64_t steps = metrics_.spec_verify_steps - spec_log_.verify_steps;
  int64_t fixed = metrics_.spec_fixed_steps - spec_log_.fixed_steps;
  if (steps > 0)
    spdlog::info("EAGLE3: accept length {:.2f} over {} verify steps; {:.0f}% of {} decode steps as CUDA graphs",
                 double(metrics_.spec_accepted_tokens - spec_log_.accepted_tokens) / double(steps), steps,
                 fixed ? 100.0 * double(metrics_.spec_graph_steps - spec_log_.graph_steps) / double(fixed) : 0.0, fixed);
  spec_log_ = {now, metrics_.spec_verify_steps, metrics_.spec_accepted_tokens, metrics_.spec_fixed_steps,
               metrics_.spec_graph_steps};
}

Engine::Engine(const EngineOptions& opts) : impl_(std::make_unique<EngineImpl>(opts)) {}
Engine::~Engine() = default;
void Engine::start() {
  TS_CHECK(!impl_->step_channel || impl_->node_rank == 0, "node {}: a worker node runs run_worker(), not start()",
           impl_->node_rank);
  impl_->start();
}
bool Engine::is_worker_node() const { return impl_->node_rank > 0; }
void Engine::run_worker() {
  TS_CHECK(impl_->step_channel && impl_->node_rank > 0, "run_worker: not a worker node (--nnodes > 1, --node-rank > 0)");
  run_worker_steps(*impl_->runner, *impl_->step_channel);
}
void Engine::stop() { impl_->stop(); }
std::shared_ptr<Stream> Engine::submit(GenerateParams p) { return impl_->submit(std::move(p)); }
PromptPassResult Engine::prompt_pass(PromptPassRequest req) { return impl_->prompt_pass(std::move(req)); }
EngineMetrics Engine::metrics() const { return impl_->metrics(); }
const tok::Tokenizer& Engine::tokenizer() const { return *impl_->tokenizer; }
std::shared_ptr<const tok::Tokenizer> Engine::tokenizer_ptr() const { return impl_->tokenizer; }
int64_t Engine::context_length() const { return impl_->context_len; }
int64_t Engine::vocab_size() const { return impl_->model->config().vocab_size; }
std::vector<int32_t> Engine::eos_token_ids() const { return {impl_->eos.begin(), impl_->eos.end()}; }
std::string Engine::model_dir() const { return impl_->opts.model_dir; }
std::string Engine::device_name() const { return ::ts::device_name(impl_->device); }
void Engine::set_kv_event_sink(std::function<void(std::vector<KvCacheEvent>&)> sink) {
  impl_->kv_event_sink = std::move(sink);
}

}  // namespace ts
