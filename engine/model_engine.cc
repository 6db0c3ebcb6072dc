#include "engine/model_engine.h"

#include <algorithm>
#include <filesystem>

#include "absl/strings/str_cat.h"
#include "engine/checkpoint.h"
#include "engine/cpu/cpu_executor.h"
#include "engine/gpu_backend.h"
#include "memory/host_block_pool.h"

namespace ballast::engine {

struct ModelEngine::Sequence {
  GenerationRequest req;
  GenerationSink* sink = nullptr;
  std::vector<int> tokens;  // prompt, then generated tokens
  int prompt_len = 0;
  int num_computed = 0;  // leading tokens whose KV is written
  SequenceKv kv;
  bool admitted_once = false;
  std::mt19937_64 rng;  // host sampling
  uint64_t seed = 0;    // device sampling: draw i is Philox(seed, i)
  std::unique_ptr<OutputText> out;
  GenerationResult result;
  absl::Time first_scheduled = absl::InfinitePast();
  absl::Time first_token = absl::InfinitePast();
  absl::Time last_token = absl::InfinitePast();
  int take = 0;  // tokens scheduled in the current step
  int outputs() const { return static_cast<int>(tokens.size()) - prompt_len; }
};

namespace {
double Ms(absl::Duration d) { return absl::ToDoubleMilliseconds(d); }
}  // namespace

absl::StatusOr<std::unique_ptr<ModelEngine>> ModelEngine::Create(const ModelEngineOptions& o,
                                                                 std::function<void()> wake) {
  if (o.backend != "cpu" && o.backend != "cuda") {
    return absl::InvalidArgumentError(absl::StrCat("model ", o.name, ": backend \"", o.backend,
                                                   "\" is unknown (expected cpu or cuda)"));
  }
  const bool gpu = o.backend == "cuda";
  if (o.block_tokens <= 0 || o.max_batch_tokens <= 0 || o.max_seqs <= 0 || o.kv_cache_bytes <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("model ", o.name,
                     ": block_tokens, max_batch_tokens, max_seqs, kv_cache_bytes must be > 0"));
  }
  std::unique_ptr<ModelEngine> e(new ModelEngine(o, std::move(wake)));
  auto cfg = ModelConfig::Load((std::filesystem::path(o.path) / "config.json").string());
  if (!cfg.ok()) return cfg.status();
  e->config_ = *cfg;
  for (const char* f : {"tokenizer.json", "tokenizer.model"}) {
    if (std::filesystem::exists(std::filesystem::path(o.path) / f)) {
      return absl::UnimplementedError(absl::StrCat(
          o.path, "/", f, ": checkpoint tokenizers are not supported yet; only synthetic models ",
          "(byte tokenizer, no tokenizer file) can be served"));
    }
  }
  if (e->config_.vocab_size < ByteTokenizer::kMinVocab) {
    return absl::InvalidArgumentError(
        absl::StrCat(o.path, "/config.json: vocab_size ", e->config_.vocab_size, " < ",
                     ByteTokenizer::kMinVocab, " needed by the byte tokenizer"));
  }
  e->tokenizer_ = std::make_unique<ByteTokenizer>();
  e->context_window_ = e->config_.max_position_embeddings;
  if (o.max_context > 0) e->context_window_ = std::min(e->context_window_, o.max_context);

  KvLayout layout;
  layout.num_layers = e->config_.num_hidden_layers;
  layout.num_kv_heads = e->config_.num_key_value_heads;
  layout.head_dim = e->config_.head_dim;
  layout.block_tokens = o.block_tokens;
  if (gpu) layout.dtype = GpuAutoKvDType(e->config_);
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
    e->arena_ = o.kv_arena;
    e->allocator_ = std::move(*view);
  } else {
    const int64_t blocks = o.kv_cache_bytes / static_cast<int64_t>(layout.block_bytes());
    if (blocks < layout.num_layers) {
      return absl::InvalidArgumentError(
          absl::StrCat("model ", o.name, ": kv_cache_bytes ", o.kv_cache_bytes, " holds ", blocks,
                       " blocks of ", layout.block_bytes(), " bytes; at least one per layer (",
                       layout.num_layers, ") is needed"));
    }
    if (gpu) {
      auto pool = CreateGpuBlockPool(o.device, layout.block_bytes(), blocks);
      if (!pool.ok()) return pool.status();
      e->allocator_ = std::move(*pool);
    } else {
      auto pool = memory::HostBlockPool::Create(layout.block_bytes(), blocks);
      if (!pool.ok()) return pool.status();
      e->allocator_ = std::move(*pool);
    }
  }
  e->kv_ = std::make_unique<KvCache>(layout, e->allocator_.get());
  if (gpu) {
    GpuExecutorOptions g;
    g.device = o.device;
    g.max_batch_tokens = o.max_batch_tokens;
    g.max_context = e->context_window_;
    g.cuda_graphs = o.cuda_graphs;
    if (o.weight_pages) {
      g.weights_at = o.weight_pages->data();
      g.weights_capacity = o.weight_pages->bytes();
    }
    g.host_weights = o.host_weights;
    auto ex = CreateGpuExecutor(e->config_, o.path, e->kv_.get(), g);
    if (!ex.ok()) return ex.status();
    e->executor_ = std::move(*ex);
  } else {
    std::shared_ptr<const ModelWeights> weights;
    if (o.host_weights) {
      const auto* host = dynamic_cast<const CpuHostWeights*>(o.host_weights.get());
      if (host == nullptr) {
        return absl::InvalidArgumentError(
            absl::StrCat("model ", o.name, ": host weight copy was not made by the cpu backend"));
      }
      weights = host->weights();
    } else {
      auto w = ModelWeights::Load(o.path, e->config_);
      if (!w.ok()) return w.status();
      weights = std::make_shared<const ModelWeights>(std::move(*w));
    }
    auto ex = CpuExecutor::Create(e->config_, std::move(weights), e->kv_.get());
    if (!ex.ok()) return ex.status();
    e->executor_ = std::move(*ex);
  }
  e->PublishStats();
  return e;
}

absl::StatusOr<int64_t> ModelEngine::WeightBytesNeeded(const ModelEngineOptions& o) {
  auto cfg = ModelConfig::Load((std::filesystem::path(o.path) / "config.json").string());
  if (!cfg.ok()) return cfg.status();
  if (o.backend == "cuda") return GpuWeightBytes(*cfg);
  // The cpu backend reports the checkpoint's stored bytes (weight_bytes()).
  CheckpointIndex idx;
  if (auto st = idx.Open(o.path); !st.ok()) return st;
  return idx.TotalBytes();
}

ModelEngine::ModelEngine(const ModelEngineOptions& options, std::function<void()> wake)
    : options_(options), wake_(std::move(wake)) {}

ModelEngine::~ModelEngine() {
  AbortAll(absl::UnavailableError(absl::StrCat("model ", options_.name, " unloaded")));
  for (auto& [id, s] : sessions_) kv_->Release(&s.kv);
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

absl::Status ModelEngine::Submit(GenerationRequest req, GenerationSink* sink) {
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
  if (kv_->BlocksNeeded(SequenceKv{}, positions) > allocator_->num_max()) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "prompt (", n, " tokens) + max_tokens (", p.max_tokens, ") needs ",
        kv_->BlocksNeeded(SequenceKv{}, positions), " KV blocks; model ", options_.name,
        " can have at most ", allocator_->num_max(), " (raise the KV memory or lower max_tokens)"));
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
  auto seq = std::make_unique<Sequence>();
  if (req.arrival == absl::InfinitePast()) req.arrival = absl::Now();
  seq->tokens = req.prompt;
  seq->prompt_len = static_cast<int>(req.prompt.size());
  seq->seed = p.seed
                  ? *p.seed
                  : (static_cast<uint64_t>(std::random_device{}()) << 32 | std::random_device{}());
  seq->rng.seed(seq->seed);
  seq->out = std::make_unique<OutputText>(tokenizer_.get(), p.stop);
  seq->result.prompt_tokens = seq->prompt_len;
  seq->result.kv_source = req.history_tokens > 0 ? KvSource::kRecomputed : KvSource::kNone;
  seq->sink = sink;
  seq->req = std::move(req);
  {
    absl::MutexLock lock(&mu_);
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
  return !cancels_.empty() || !drop_sessions_.empty();
}

EngineStats ModelEngine::stats() const {
  absl::MutexLock lock(&mu_);
  return stats_;
}

void ModelEngine::PublishStats() {
  EngineStats s;
  s.waiting = static_cast<int>(waiting_.size());
  s.running = static_cast<int>(running_.size());
  s.kv_blocks_total = allocator_->num_total();
  s.kv_blocks_free = allocator_->num_free();
  s.cached_sessions = static_cast<int>(sessions_.size());
  s.preemptions = preemptions_;
  s.tokens_generated = tokens_generated_;
  s.steps = steps_;
  absl::MutexLock lock(&mu_);
  s.waiting += static_cast<int>(inbox_.size());
  stats_ = s;
}

void ModelEngine::DrainInbox() {
  std::vector<std::unique_ptr<Sequence>> in;
  absl::flat_hash_set<std::string> cancels;
  std::vector<std::string> drops;
  {
    absl::MutexLock lock(&mu_);
    in.swap(inbox_);
    cancels.swap(cancels_);
    drops.swap(drop_sessions_);
  }
  for (auto& s : in) waiting_.push_back(std::move(s));
  for (const auto& sid : drops) {
    if (auto it = sessions_.find(sid); it != sessions_.end()) {
      kv_->Release(&it->second.kv);
      sessions_.erase(it);
    }
  }
  if (cancels.empty()) return;
  auto cancel_from = [&](auto& container) {
    for (auto it = container.begin(); it != container.end();) {
      if (cancels.contains((*it)->req.id)) {
        auto seq = std::move(*it);
        it = container.erase(it);
        Fail(std::move(seq), absl::CancelledError("request cancelled"));
      } else {
        ++it;
      }
    }
  };
  cancel_from(waiting_);
  cancel_from(running_);
}

void ModelEngine::Admit(Sequence* seq) {
  if (seq->admitted_once) return;
  seq->admitted_once = true;
  if (seq->req.session_id.empty()) return;
  auto it = sessions_.find(seq->req.session_id);
  if (it == sessions_.end()) return;
  // Reuse the longest common prefix; at least one token must be computed
  // to produce logits.
  const auto& cached = it->second.tokens;
  size_t common = 0;
  while (common < cached.size() && common < seq->tokens.size() &&
         cached[common] == seq->tokens[common]) {
    ++common;
  }
  common = std::min(common, seq->tokens.size() - 1);
  seq->kv = std::move(it->second.kv);
  sessions_.erase(it);
  seq->num_computed = static_cast<int>(common);
  seq->result.cached_tokens = static_cast<int>(common);
  if (common > 0) seq->result.kv_source = KvSource::kDevice;
}

int64_t ModelEngine::ShedKv(int64_t want_bytes) {
  const int64_t block = static_cast<int64_t>(allocator_->block_bytes());
  int64_t freed = 0;
  while (freed < want_bytes && !sessions_.empty()) {
    const int64_t before = allocator_->num_free();
    EvictOneCachedSession();
    freed += (allocator_->num_free() - before) * block;
  }
  while (freed < want_bytes && !running_.empty()) {
    // Lowest priority first; among equals the newest (last admitted).
    size_t victim = running_.size() - 1;
    for (size_t i = running_.size(); i-- > 0;) {
      if (running_[i]->req.priority < running_[victim]->req.priority) victim = i;
    }
    std::unique_ptr<Sequence> v = std::move(running_[victim]);
    running_.erase(running_.begin() + static_cast<std::ptrdiff_t>(victim));
    freed += v->kv.num_blocks() * block;
    Preempt(v.get());
    waiting_.push_front(std::move(v));
  }
  PublishStats();
  return freed;
}

bool ModelEngine::EvictOneCachedSession() {
  if (sessions_.empty()) return false;
  auto victim = sessions_.begin();
  for (auto it = sessions_.begin(); it != sessions_.end(); ++it) {
    if (it->second.last_use < victim->second.last_use) victim = it;
  }
  kv_->Release(&victim->second.kv);
  sessions_.erase(victim);
  return true;
}

void ModelEngine::Preempt(Sequence* seq) {
  kv_->Release(&seq->kv);
  seq->num_computed = 0;
  ++seq->result.preemptions;
  ++preemptions_;
}

bool ModelEngine::ReserveOrReclaim(Sequence* seq, int tokens, bool may_preempt) {
  while (true) {
    if (kv_->Reserve(&seq->kv, tokens).ok()) return true;
    if (EvictOneCachedSession()) continue;
    if (!may_preempt || running_.empty()) return false;
    // Preempt the newest running sequence (possibly `seq` itself).
    std::unique_ptr<Sequence> victim = std::move(running_.back());
    running_.pop_back();
    Sequence* v = victim.get();
    Preempt(v);
    waiting_.push_front(std::move(victim));
    if (v == seq) return false;
  }
}

std::vector<QueuedRequest> ModelEngine::Queued() {
  DrainInbox();
  std::vector<QueuedRequest> out;
  out.reserve(waiting_.size());
  for (const auto& s : waiting_) {
    out.push_back({s->req.id, s->req.arrival, s->req.ttft_slo_ms, s->req.reject_if_slo_unmet,
                   static_cast<int>(s->tokens.size()) - s->num_computed, s->admitted_once});
  }
  return out;
}

void ModelEngine::SetAdmissionOrder(const absl::flat_hash_map<std::string, int>& rank) {
  // Keys once per sequence (not per comparison): preempted first, then rank.
  std::vector<std::pair<std::pair<int, int>, std::unique_ptr<Sequence>>> keyed;
  keyed.reserve(waiting_.size());
  for (auto& s : waiting_) {
    auto it = rank.find(s->req.id);
    const std::pair<int, int> key =
        s->admitted_once ? std::pair<int, int>(0, 0)
                         : std::pair<int, int>(1, it == rank.end() ? INT32_MAX : it->second);
    keyed.emplace_back(key, std::move(s));
  }
  std::stable_sort(keyed.begin(), keyed.end(),
                   [](const auto& a, const auto& b) { return a.first < b.first; });
  waiting_.clear();
  for (auto& [key, s] : keyed) waiting_.push_back(std::move(s));
}

void ModelEngine::RejectWaiting(const std::string& id, const absl::Status& why) {
  for (auto it = waiting_.begin(); it != waiting_.end(); ++it) {
    if ((*it)->req.id != id) continue;
    auto s = std::move(*it);
    waiting_.erase(it);
    Fail(std::move(s), why);
    return;
  }
}

bool ModelEngine::Step() {
  last_prefill_tokens_ = 0;  // also when this step does nothing
  DrainInbox();
  if (running_.empty() && waiting_.empty()) {
    PublishStats();
    return false;
  }
  int budget = options_.max_batch_tokens;
  std::vector<Sequence*> plan;
  // 1. Running sequences, oldest first.
  for (size_t i = 0; i < running_.size() && budget > 0; ++i) {
    Sequence* s = running_[i].get();
    const int take = std::min(static_cast<int>(s->tokens.size()) - s->num_computed, budget);
    if (!ReserveOrReclaim(s, s->num_computed + take, /*may_preempt=*/true)) break;
    s->take = take;
    budget -= take;
    plan.push_back(s);
  }
  // 2. Waiting requests, without preempting anyone.
  while (budget > 0 && !waiting_.empty() && static_cast<int>(running_.size()) < options_.max_seqs) {
    Sequence* s = waiting_.front().get();
    Admit(s);
    const int take = std::min(static_cast<int>(s->tokens.size()) - s->num_computed, budget);
    // Watermark: admit only if every running sequence can still grow by one
    // block per layer afterwards; otherwise the newcomer would be preempted
    // at the next block boundary and its prefill wasted (thrashing).
    const int64_t headroom = static_cast<int64_t>(running_.size()) * config_.num_hidden_layers;
    const bool fits =
        allocator_->num_free() - kv_->BlocksNeeded(s->kv, s->num_computed + take) >= headroom;
    // No room now: wait. Submit() refused requests that could never fit;
    // in elastic mode other models may hold the memory for a while.
    if (!fits || !ReserveOrReclaim(s, s->num_computed + take, /*may_preempt=*/false)) break;
    s->take = take;
    budget -= take;
    plan.push_back(s);
    running_.push_back(std::move(waiting_.front()));
    waiting_.pop_front();
  }
  if (plan.empty()) {
    PublishStats();
    return false;
  }
  for (const Sequence* s : plan) {
    // Everything but a single decode token is prefill work (a prompt chunk,
    // or a preempted sequence recomputing its KV).
    const bool decode = s->take == 1 && s->num_computed + 1 == static_cast<int>(s->tokens.size());
    if (!decode) last_prefill_tokens_ += s->take;
  }
  // 3. Forward.
  std::vector<SequenceChunk> chunks;
  chunks.reserve(plan.size());
  const absl::Time now = absl::Now();
  for (Sequence* s : plan) {
    if (s->first_scheduled == absl::InfinitePast()) s->first_scheduled = now;
    SequenceChunk c;
    c.kv = &s->kv;
    c.start_pos = s->num_computed;
    c.tokens = absl::MakeConstSpan(s->tokens).subspan(s->num_computed, s->take);
    c.logits = s->num_computed + s->take == static_cast<int>(s->tokens.size()) ? LogitsMode::kLast
                                                                               : LogitsMode::kNone;
    chunks.push_back(c);
  }
  std::vector<float> logits;
  std::vector<int> sampled;
  absl::Status st;
  if (executor_->samples_on_device()) {
    std::vector<DeviceSampling> sampling;
    for (size_t i = 0; i < plan.size(); ++i) {
      if (chunks[i].logits == LogitsMode::kNone) continue;
      const Sequence* s = plan[i];
      sampling.push_back({s->req.params.sampling, s->seed, static_cast<uint64_t>(s->outputs())});
    }
    st = executor_->ForwardSample(chunks, sampling, &sampled);
  } else {
    st = executor_->Forward(chunks, &logits);
  }
  ++steps_;
  if (!st.ok()) {
    AbortAll(st);
    PublishStats();
    return true;
  }
  size_t row = 0;
  for (Sequence* s : plan) {
    s->num_computed += s->take;
    if (s->num_computed == static_cast<int>(s->tokens.size())) {
      const int id = executor_->samples_on_device()
                         ? sampled[row]
                         : SampleToken(logits.data() + row * config_.vocab_size, config_.vocab_size,
                                       s->req.params.sampling, s->rng);
      AfterToken(s, id);
      ++row;
    }
  }
  // Retire finished sequences (AfterToken marks them with take = -1).
  for (auto it = running_.begin(); it != running_.end();) {
    if ((*it)->take == -1) {
      auto seq = std::move(*it);
      it = running_.erase(it);
      const FinishReason reason = seq->result.reason;
      Finish(std::move(seq), reason);
    } else {
      ++it;
    }
  }
  PublishStats();
  return true;
}

void ModelEngine::AfterToken(Sequence* s, int id) {
  const absl::Time now = absl::Now();
  if (s->first_token == absl::InfinitePast()) s->first_token = now;
  s->last_token = now;
  s->tokens.push_back(id);
  ++tokens_generated_;
  bool done = false;
  std::string text;
  if (id == tokenizer_->eos_id() && !s->req.params.ignore_eos) {
    s->result.reason = FinishReason::kEos;
    text = s->out->Finish();
    done = true;
  } else {
    bool stopped = false;
    text = s->out->Add(id, &stopped);
    if (stopped) {
      s->result.reason = FinishReason::kStop;
      done = true;
    } else if (s->outputs() >= s->req.params.max_tokens) {
      s->result.reason = FinishReason::kLength;
      done = true;
    } else if (static_cast<int>(s->tokens.size()) >= context_window_) {
      s->result.reason = FinishReason::kContext;
      done = true;
    }
    if (done && !stopped) text += s->out->Finish();
  }
  s->sink->OnToken(id, text);
  if (done) s->take = -1;
}

void ModelEngine::Finish(std::unique_ptr<Sequence> s, FinishReason reason) {
  GenerationResult& r = s->result;
  r.reason = reason;
  r.output_tokens.assign(s->tokens.begin() + s->prompt_len, s->tokens.end());
  r.text = s->out->released();
  const absl::Time now = absl::Now();
  r.queue_ms = Ms(s->first_scheduled - s->req.arrival);
  r.ttft_ms = Ms(s->first_token - s->req.arrival);
  r.e2e_ms = Ms(now - s->req.arrival);
  const int n = static_cast<int>(r.output_tokens.size());
  r.mean_tpot_ms = n > 1 ? Ms(s->last_token - s->first_token) / (n - 1) : 0.0;
  if (!s->req.session_id.empty()) {
    // Keep the KV of every token but the last generated one (never fed).
    auto& slot = sessions_[s->req.session_id];
    kv_->Release(&slot.kv);
    slot.kv = std::move(s->kv);
    slot.tokens.assign(s->tokens.begin(), s->tokens.begin() + s->num_computed);
    slot.last_use = ++use_clock_;
  } else {
    kv_->Release(&s->kv);
  }
  --active_;
  s->sink->OnDone(std::move(r));
}

void ModelEngine::Fail(std::unique_ptr<Sequence> s, const absl::Status& status) {
  kv_->Release(&s->kv);
  --active_;
  s->sink->OnDone(status);
}

void ModelEngine::AbortAll(const absl::Status& why) {
  {
    absl::MutexLock lock(&mu_);
    for (auto& s : inbox_) waiting_.push_back(std::move(s));
    inbox_.clear();
  }
  while (!running_.empty()) {
    auto s = std::move(running_.back());
    running_.pop_back();
    Fail(std::move(s), why);
  }
  while (!waiting_.empty()) {
    auto s = std::move(waiting_.front());
    waiting_.pop_front();
    Fail(std::move(s), why);
  }
}

}  // namespace ballast::engine
