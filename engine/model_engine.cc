#include "engine/model_engine.h"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <random>

#include "absl/strings/str_cat.h"
#include "engine/checkpoint.h"
#include "engine/cpu/cpu_executor.h"
#include "engine/gpu_backend.h"
#include "engine/kv_export.h"
#include "engine/kv_relocation.h"
#include "memory/host_block_pool.h"
#include "spdlog/spdlog.h"

namespace ballast::engine {

namespace {
// The options beyond temperature, top-p and top-k (engine/sampler.h).
absl::Status ValidatePenalties(const SamplingOptions& s) {
  // Written as negations so that NaN fails too.
  if (!(s.min_p >= 0 && s.min_p <= 1)) {
    return absl::InvalidArgumentError("sampling: min_p must be in [0, 1]");
  }
  if (!(s.presence_penalty >= -2 && s.presence_penalty <= 2 && s.frequency_penalty >= -2 &&
        s.frequency_penalty <= 2)) {
    return absl::InvalidArgumentError(
        "sampling: presence_penalty and frequency_penalty must be in [-2, 2]");
  }
  if (!(s.repetition_penalty > 0) || std::isinf(s.repetition_penalty)) {
    return absl::InvalidArgumentError("sampling: repetition_penalty must be > 0");
  }
  if (s.top_logprobs < -1 || s.top_logprobs > kMaxTopLogprobs) {
    return absl::InvalidArgumentError(
        absl::StrCat("sampling: top_logprobs must be in [0, ", kMaxTopLogprobs, "] (or -1: none)"));
  }
  return absl::OkStatus();
}
}  // namespace

absl::StatusOr<std::unique_ptr<ModelEngine>> ModelEngine::Create(const ModelEngineOptions& o,
                                                                 std::function<void()> wake) {
  if (o.backend != "cpu" && o.backend != "cuda") {
    return absl::InvalidArgumentError(absl::StrCat("model ", o.name, ": backend \"", o.backend,
                                                   "\" is unknown (expected cpu or cuda)"));
  }
  if (o.kv_tiers &&
      (o.model_fingerprint == 0 || o.kv_tiers->chunk_tokens() % o.block_tokens != 0)) {
    return absl::InvalidArgumentError(
        absl::StrCat("model ", o.name,
                     ": KV tiers need a model fingerprint and a chunk size that is a multiple "
                     "of block_tokens (",
                     o.block_tokens, ")"));
  }
  if (o.block_tokens <= 0 || o.max_batch_tokens <= 0 || o.max_seqs <= 0 || o.kv_cache_bytes <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("model ", o.name,
                     ": block_tokens, max_batch_tokens, max_seqs, kv_cache_bytes must be > 0"));
  }
  std::unique_ptr<ModelEngine> e(new ModelEngine(o, std::move(wake)));
  if (auto st = e->LoadModel(); !st.ok()) return st;
  if (auto st = e->InitKv(); !st.ok()) return st;
  if (auto st = e->InitExecutor(); !st.ok()) return st;
  e->remapper_ = WeightRemapper::Create(e->executor_.get(), o.weight_pages);
  if (e->remapper_ && o.prepare_remap) {
    if (auto st = e->remapper_->Prepare(); !st.ok()) return st;
    e->remapper_->SetActivationDecode(e->TimeOneDecode());
  }
  e->PublishStats();
  return e;
}

absl::Status ModelEngine::LoadModel() {
  const ModelEngineOptions& o = options_;
  auto cfg = ModelConfig::Load((std::filesystem::path(o.path) / "config.json").string());
  if (!cfg.ok()) return cfg.status();
  config_ = *cfg;
  if (auto st = ApplyServingQuant(o.quantization, &config_); !st.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("model ", o.name, ": ", st.message()));
  }
  // tokenizer.json when the checkpoint has one, else the byte tokenizer of
  // synthetic models (engine/tokenizer.h).
  auto tokenizer = LoadCheckpointTokenizer(o.path, config_.vocab_size);
  if (!tokenizer.ok()) return tokenizer.status();
  tokenizer_ = std::move(*tokenizer);
  context_window_ = config_.max_position_embeddings;
  if (o.max_context > 0) context_window_ = std::min(context_window_, o.max_context);
  return absl::OkStatus();
}

absl::Status ModelEngine::InitKv() {
  const ModelEngineOptions& o = options_;
  const bool gpu = o.backend == "cuda";
  KvLayout layout;
  layout.num_layers = config_.num_hidden_layers;
  layout.num_kv_heads = config_.num_key_value_heads;
  layout.head_dim = config_.head_dim;
  layout.block_tokens = o.block_tokens;
  if (gpu) layout.dtype = GpuAutoKvDType(config_);
  if (o.kv_dtype != "auto") {
    auto dt = DTypeFromConfig(o.kv_dtype);
    if (!dt.ok())
      return absl::InvalidArgumentError(
          absl::StrCat("model ", o.name, ": kv_dtype: ", dt.status().message()));
    layout.dtype = *dt;
  }
  if (o.kv_arena) {
    auto view = o.kv_arena->CreateAllocator(layout.block_bytes(), o.kv_limits);
    if (!view.ok()) return view.status();
    arena_ = o.kv_arena;
    allocator_ = std::move(*view);
  } else {
    const int64_t blocks = o.kv_cache_bytes / static_cast<int64_t>(layout.block_bytes());
    if (blocks < layout.num_layers) {
      return absl::InvalidArgumentError(
          absl::StrCat("model ", o.name, ": kv_cache_bytes ", o.kv_cache_bytes, " holds ", blocks,
                       " blocks of ", layout.block_bytes(), " bytes; at least one per layer (",
                       layout.num_layers, ") is needed"));
    }
    auto pool = gpu ? CreateGpuBlockPool(o.device, layout.block_bytes(), blocks)
                    : absl::StatusOr<std::unique_ptr<memory::BlockAllocator>>(
                          memory::HostBlockPool::Create(layout.block_bytes(), blocks));
    if (!pool.ok()) return pool.status();
    allocator_ = std::move(*pool);
  }
  kv_ = std::make_unique<KvCache>(layout, allocator_.get());
  kv_fingerprint_ = KvFingerprint(o.model_fingerprint, layout, config_.weight_quant);
  kv_manager_ = std::make_unique<KvManager>(kv_.get());
  std::function<int64_t(int64_t, uint64_t)> reclaim;
  if (o.reclaim_kv) {
    reclaim = [this, ask = o.reclaim_kv](int64_t bytes, uint64_t newer_than) {
      const absl::Time t0 = absl::Now();
      const int64_t got = ask(bytes, newer_than);
      reclaim_ms_ += absl::ToDoubleMilliseconds(absl::Now() - t0);
      return got;
    };
  }
  planner_ = std::make_unique<BatchPlanner>(
      BatchPlannerOptions{o.max_batch_tokens, o.max_seqs, std::move(reclaim)}, kv_manager_.get());
  return absl::OkStatus();
}

absl::Status ModelEngine::InitExecutor() {
  const ModelEngineOptions& o = options_;
  if (o.backend == "cuda") {
    GpuExecutorOptions g;
    g.device = o.device;
    g.max_batch_tokens = o.max_batch_tokens;
    g.max_seqs = o.max_seqs;
    g.max_context = context_window_;
    g.cuda_graphs = o.cuda_graphs;
    g.deterministic = o.deterministic;
    g.gemm_tune_candidates = o.gemm_tune_candidates;
    g.warm_products = o.warm_products;
    g.step_done = o.step_done;
    g.sm_partition = o.sm_partition;
    g.sm_partition_rest = o.sm_partition_rest;
    if (o.weight_pages) {
      g.weights_at = o.weight_pages->data();
      g.weights_capacity = o.weight_pages->bytes();
    }
    g.host_weights = o.host_weights;
    g.host_arena = o.host_arena;
    auto ex = CreateGpuExecutor(config_, o.path, kv_.get(), g);
    if (!ex.ok()) return ex.status();
    executor_ = std::move(*ex);
    return absl::OkStatus();
  }
  std::shared_ptr<const ModelWeights> weights;
  if (o.host_weights) {
    const auto* host = dynamic_cast<const CpuHostWeights*>(o.host_weights.get());
    if (host == nullptr) {
      return absl::InvalidArgumentError(
          absl::StrCat("model ", o.name, ": host weight copy was not made by the cpu backend"));
    }
    weights = host->weights();
  } else {
    auto w = ModelWeights::Load(o.path, config_);
    if (!w.ok()) return w.status();
    weights = std::make_shared<const ModelWeights>(std::move(*w));
  }
  auto ex = CpuExecutor::Create(config_, std::move(weights), kv_.get(), o.cpu_sample_in_step);
  if (!ex.ok()) return ex.status();
  executor_ = std::move(*ex);
  return absl::OkStatus();
}

double ModelEngine::TimeOneDecode() {
  SequenceKv seq;
  if (!kv_->Reserve(&seq, 1).ok()) return 0;  // no KV free now: T_c waits for live steps
  const int token = 1;
  SequenceChunk c;
  c.kv = &seq;
  c.tokens = absl::MakeConstSpan(&token, 1);
  std::vector<float> logits;
  double best = 0;
  for (int i = 0; i < 3; ++i) {  // the first run also plans (and may capture a graph)
    const absl::Time t0 = absl::Now();
    if (!executor_->Forward({c}, &logits).ok()) break;
    const double s = absl::ToDoubleSeconds(absl::Now() - t0);
    if (i > 0) best = best > 0 ? std::min(best, s) : s;
  }
  kv_->Release(&seq);
  return best;
}

absl::StatusOr<int64_t> ModelEngine::WeightBytesNeeded(const ModelEngineOptions& o) {
  auto cfg = ModelConfig::Load((std::filesystem::path(o.path) / "config.json").string());
  if (!cfg.ok()) return cfg.status();
  if (auto st = ApplyServingQuant(o.quantization, &*cfg); !st.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("model ", o.name, ": ", st.message()));
  }
  if (o.backend == "cuda") return GpuWeightBytes(*cfg);
  // The cpu backend reports the checkpoint's stored bytes (weight_bytes()).
  CheckpointIndex idx;
  if (auto st = idx.Open(o.path); !st.ok()) return st;
  return idx.TotalBytes();
}

ModelEngine::ModelEngine(const ModelEngineOptions& options, std::function<void()> wake)
    : options_(options), wake_(std::move(wake)) {}

ModelEngine::~ModelEngine() {
  // A Create that failed early has no planner (and nothing queued).
  if (planner_)
    AbortAll(absl::UnavailableError(absl::StrCat("model ", options_.name, " unloaded")));
  // Members then go in reverse order: the planner and the KV manager free
  // what they hold into kv_ and allocator_, which outlive them.
}

int64_t ModelEngine::kv_bytes() const {
  if (!arena_) return options_.kv_cache_bytes;
  return (allocator_->num_total() - allocator_->num_free()) *
         static_cast<int64_t>(allocator_->block_bytes());
}

absl::Status ModelEngine::SetKvLimits(const memory::TenantLimits& limits) {
  if (!arena_) {
    return absl::FailedPreconditionError(
        absl::StrCat("model ", options_.name, " has a static KV pool (node.memory.mode: static)"));
  }
  auto st = arena_->SetLimits(allocator_.get(), limits);
  if (st.ok() && wake_) wake_();  // waiting requests may fit now
  return st;
}

std::string ModelEngine::kv_dtype_name() const {
  return std::string(ConfigName(kv_->layout().dtype));
}

absl::Status ModelEngine::Validate(const GenerationRequest& req) const {
  const GenerationParams& p = req.params;
  if (req.prompt.empty()) return absl::InvalidArgumentError("prompt is empty");
  if (p.max_tokens <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("max_tokens must be > 0 (got ", p.max_tokens, ")"));
  }
  const int64_t n = static_cast<int64_t>(req.prompt.size());
  if (n >= context_window_) {
    return absl::InvalidArgumentError(absl::StrCat("prompt is ", n, " tokens; model ",
                                                   options_.name, " has a context window of ",
                                                   context_window_));
  }
  if (n + p.max_tokens > context_window_) {
    return absl::InvalidArgumentError(absl::StrCat(
        "prompt (", n, " tokens) + max_tokens (", p.max_tokens, ") exceeds the context window of ",
        context_window_, "; use max_tokens <= ", context_window_ - n));
  }
  // The sequence must fit the KV pool on its own, or it could never finish
  // (it would be preempted and recomputed forever).
  const int positions = static_cast<int>(n) + p.max_tokens - 1;
  const int blocks = kv_->BlocksNeeded(SequenceKv{}, positions);
  if (blocks > allocator_->num_max()) {
    return absl::ResourceExhaustedError(
        absl::StrCat("prompt (", n, " tokens) + max_tokens (", p.max_tokens, ") needs ", blocks,
                     " KV blocks; model ", options_.name, " can have at most ",
                     allocator_->num_max(), " (raise the KV memory or lower max_tokens)"));
  }
  for (int id : req.prompt) {
    if (id < 0 || id >= config_.vocab_size) {
      return absl::InvalidArgumentError(
          absl::StrCat("token id ", id, " outside the vocabulary [0, ", config_.vocab_size, ")"));
    }
  }
  if (p.sampling.temperature < 0 || p.sampling.top_p < 0 || p.sampling.top_p > 1 ||
      p.sampling.top_k < 0) {
    return absl::InvalidArgumentError(
        "sampling: temperature must be >= 0, top_p in [0, 1], top_k >= 0");
  }
  return ValidatePenalties(p.sampling);
}

std::unique_ptr<Sequence> ModelEngine::NewSequence(GenerationRequest req,
                                                   GenerationSink* sink) const {
  const GenerationParams& p = req.params;
  auto seq = std::make_unique<Sequence>();
  if (req.arrival == absl::InfinitePast()) req.arrival = absl::Now();
  seq->tokens = req.prompt;
  seq->prompt_len = static_cast<int>(req.prompt.size());
  seq->max_len = static_cast<int>(
      std::min<int64_t>(static_cast<int64_t>(seq->prompt_len) + p.max_tokens, context_window_));
  seq->seed = p.seed
                  ? *p.seed
                  : (static_cast<uint64_t>(std::random_device{}()) << 32 | std::random_device{}());
  seq->rng.seed(seq->seed);
  if (p.sampling.has_penalties()) {
    seq->penalties = PenaltyState(req.prompt, p.sampling.repetition_penalty != 1.0f);
  }
  seq->out = std::make_unique<OutputText>(tokenizer_.get(), p.stop, p.skip_special_tokens);
  seq->result.prompt_tokens = seq->prompt_len;
  seq->result.kv_source = req.history_tokens > 0 ? KvSource::kRecomputed : KvSource::kNone;
  seq->sink = sink;
  seq->req = std::move(req);
  return seq;
}

absl::Status ModelEngine::Submit(GenerationRequest req, GenerationSink* sink) {
  if (auto st = Validate(req); !st.ok()) return st;
  std::unique_ptr<Sequence> seq = NewSequence(std::move(req), sink);
  {
    // Checked under the lock Close takes: a request is refused here or
    // reaches the inbox before Close drains it (then Close fails it).
    absl::MutexLock lock(&mu_);
    if (closed_) {
      return absl::UnavailableError(absl::StrCat("model ", options_.name, " is unavailable (",
                                                 closed_why_.message(), "); retry"));
    }
    inbox_.push_back(std::move(seq));
    ++active_;
  }
  if (wake_) wake_();
  return absl::OkStatus();
}

void ModelEngine::Cancel(const std::string& request_id) {
  {
    absl::MutexLock lock(&mu_);
    cancels_.insert(request_id);
  }
  if (wake_) wake_();
}

void ModelEngine::DropSession(const std::string& session_id) {
  {
    absl::MutexLock lock(&mu_);
    drop_sessions_.push_back(session_id);
  }
  if (wake_) wake_();
}

bool ModelEngine::HasWork() const {
  if (active_.load() > 0) return true;
  absl::MutexLock lock(&mu_);
  return !cancels_.empty() || !drop_sessions_.empty() || !tasks_.empty();
}

EngineStats ModelEngine::stats() const {
  absl::MutexLock lock(&mu_);
  return stats_;
}

void ModelEngine::PublishStats() {
  EngineStats s;
  s.waiting = static_cast<int>(planner_->waiting().size());
  s.running = static_cast<int>(planner_->running().size());
  s.kv_blocks_total = allocator_->num_total();
  s.kv_blocks_free = allocator_->num_free();
  s.cached_sessions = kv_manager_->num_sessions();
  s.preemptions = planner_->preemptions();
  s.shed_preemptions = planner_->shed_preemptions();
  s.tokens_generated = tokens_generated_;
  s.steps = steps_;
  s.prefetches = kv_manager_->prefetch_outcomes();
  absl::MutexLock lock(&mu_);
  s.waiting += static_cast<int>(inbox_.size());
  stats_ = s;
}

void ModelEngine::DrainInbox() {
  std::vector<std::unique_ptr<Sequence>> in;
  absl::flat_hash_set<std::string> cancels;
  std::vector<std::string> drops;
  std::vector<std::function<void()>> tasks;
  {
    absl::MutexLock lock(&mu_);
    in.swap(inbox_);
    cancels.swap(cancels_);
    drops.swap(drop_sessions_);
    // Tasks (imports) copy on the model's stream and wait for it: with a
    // step in flight they would hold this thread until it ends. They run
    // at the next step begun with none in flight (CanBeginAhead refuses).
    if (flight_.empty()) tasks.swap(tasks_);
  }
  kv_manager_->ExpirePrefetches(absl::Now());
  for (auto& t : tasks) t();
  for (auto& s : in) planner_->Enqueue(std::move(s));
  for (const auto& sid : drops) kv_manager_->Drop(sid);
  // Those a step in flight computes for are failed once it ends.
  for (auto& s : planner_->Remove(cancels)) {
    Retire(std::move(s), absl::CancelledError("request cancelled"));
  }
  // Arbitration drains the inbox (Queued) without stepping an engine whose
  // work was all cancelled: the gauges must not wait for a step that may
  // never come.
  if (!in.empty() || !cancels.empty() || !drops.empty() || !tasks.empty()) PublishStats();
}

std::vector<QueuedRequest> ModelEngine::Queued() {
  // Waiting requests are in no step in flight, and cancels of running ones
  // wait for theirs (Retire): the steps in flight keep running.
  DrainInbox();
  std::vector<QueuedRequest> out;
  out.reserve(planner_->waiting().size());
  for (const auto& s : planner_->waiting()) {
    out.push_back({s->req.id, s->req.arrival, s->req.ttft_slo_ms, s->req.reject_if_slo_unmet,
                   s->remaining(), HoldsItsPlace(*s), s->kv_refused});
  }
  return out;
}

void ModelEngine::SetAdmissionOrder(const absl::flat_hash_map<std::string, int>& rank) {
  planner_->SetAdmissionOrder(rank);
}

void ModelEngine::RejectWaiting(const std::string& id, const absl::Status& why) {
  if (std::unique_ptr<Sequence> s = planner_->RemoveWaiting(id)) Fail(std::move(s), why);
}

std::vector<KvHolding> ModelEngine::KvHoldings(bool with_slabs) {
  // The steps in flight use their sequences' blocks: shedding waits for them.
  FinishAllSteps();
  return PeekKvHoldings(with_slabs);
}

std::vector<KvHolding> ModelEngine::PeekKvHoldings(bool with_slabs) const {
  std::vector<KvHolding> out = kv_manager_->Holdings(with_slabs);
  std::vector<KvHolding> running = planner_->Holdings(with_slabs);
  out.insert(out.end(), std::make_move_iterator(running.begin()),
             std::make_move_iterator(running.end()));
  return out;
}

int64_t ModelEngine::ShedOne(const KvHolding& h, int64_t want_bytes) {
  if (h.kind == KvHolding::Kind::kRunning) return planner_->Preempt(h.id);
  // The tiers hold every kept session (exported when its turn ended): the
  // later layers go first and come back from there.
  if (options_.kv_tiers && want_bytes >= 0) return kv_manager_->ShedLayers(h.id, want_bytes);
  return kv_manager_->Drop(h.id);
}

int64_t ModelEngine::Shed(const KvHolding& h, int64_t want_bytes) {
  FinishAllSteps();
  const int64_t freed = ShedOne(h, want_bytes);
  PublishStats();
  return freed;
}

absl::StatusOr<int64_t> ModelEngine::MoveKvOutOf(absl::Span<const int64_t> slabs) {
  FinishAllSteps();
  if (auto st = executor_->WaitKvLoad(); !st.ok()) return st;
  std::vector<SequenceKv*> tables;
  planner_->AppendTables(&tables);
  kv_manager_->AppendTables(&tables);
  // Empty after FinishAllSteps (FinishStep retires what it can); listed
  // so that a sequence kept there later is never left pointing at a moved
  // block.
  for (auto& [seq, why] : retired_) tables.push_back(&seq->kv);
  return RelocateBlocks(
      tables, slabs, kv_->allocator(),
      [this](absl::Span<const KvBlockMove> moves) { return executor_->MoveKvBlocks(moves); });
}

int64_t ModelEngine::ShedKv(int64_t want_bytes) {
  FinishAllSteps();
  // Cached sessions first, least recently used first; then running
  // sequences, lowest priority first, newest (last admitted) among equals.
  std::vector<KvHolding> order = KvHoldings();
  std::stable_sort(order.begin(), order.end(), [](const KvHolding& a, const KvHolding& b) {
    if (a.kind != b.kind) return a.kind == KvHolding::Kind::kCachedSession;
    if (a.kind == KvHolding::Kind::kCachedSession) return a.recency < b.recency;
    if (a.priority != b.priority) return a.priority < b.priority;
    return a.recency > b.recency;
  });
  int64_t freed = 0;
  for (const KvHolding& h : order) {
    if (freed >= want_bytes) break;
    freed += ShedOne(h, want_bytes - freed);
  }
  PublishStats();
  return freed;
}

}  // namespace ballast::engine
