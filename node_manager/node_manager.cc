#include "node_manager/node_manager.h"

#include <grpcpp/grpcpp.h>

#include "absl/algorithm/container.h"
#include "absl/random/random.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "engine/gpu_backend.h"
#include "proto/model_name.h"
#include "spdlog/spdlog.h"

namespace ballast::node_manager {

// Forwards a request's events to the caller's sink; on OnDone it counts
// the request out of its model's in-flight total, forwards, and deletes
// itself (the engine calls OnDone exactly once, last).
class NodeManager::CountingSink final : public engine::GenerationSink {
 public:
  CountingSink(NodeManager* node, std::string model, std::string session, std::string tenant,
               engine::GenerationSink* inner)
      : node_(node),
        model_(std::move(model)),
        session_(std::move(session)),
        tenant_(std::move(tenant)),
        inner_(inner) {}
  void OnToken(int id, const std::string& text, const engine::TokenLogprobs* logprobs) override {
    inner_->OnToken(id, text, logprobs);
  }
  void OnDone(absl::StatusOr<engine::GenerationResult> r) override {
    // Counted out first: once the caller sees OnDone, the count agrees.
    if (r.ok() && !session_.empty()) node_->SessionServed(tenant_, session_);
    node_->RequestDone(model_);
    inner_->OnDone(std::move(r));
    delete this;
  }

 private:
  NodeManager* const node_;
  const std::string model_;
  const std::string session_;
  const std::string tenant_;
  engine::GenerationSink* const inner_;
};

absl::StatusOr<std::unique_ptr<NodeManager>> NodeManager::Create(const NodeOptions& options) {
  if (options.node_id.empty()) return absl::InvalidArgumentError("node_id is empty");
  if (options.devices.empty())
    return absl::InvalidArgumentError("a node needs at least one device");
  for (const auto& d : options.devices) {
    if (d.memory_bytes <= 0) {
      return absl::InvalidArgumentError(absl::StrCat("device ", d.name, ": memory must be > 0"));
    }
  }
  if (options.memory_mode != "elastic" && options.memory_mode != "static") {
    return absl::InvalidArgumentError(
        absl::StrCat("memory mode \"", options.memory_mode, "\" (expected elastic or static)"));
  }
  if (options.slab_bytes == 0 || options.slab_bytes % (2u << 20) != 0) {
    return absl::InvalidArgumentError("slab size must be a positive multiple of 2 MiB");
  }
  const bool gpu = options.engine.backend == "cuda";
  if (!gpu && options.engine.backend != "cpu") {
    return absl::InvalidArgumentError(absl::StrCat("engine.backend \"", options.engine.backend,
                                                   "\" is unknown (expected cpu or cuda)"));
  }
  if (gpu && !engine::GpuBackendBuilt()) {
    return absl::UnimplementedError(
        "engine.backend cuda: this ballast was built without CUDA; use backend cpu");
  }
  std::unique_ptr<NodeManager> n(new NodeManager(options));
  if (options.kv_tiers_enabled()) {
    if (options.kv_tiers.chunk_tokens % options.engine.block_tokens != 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          "node.kv_tiers.chunk_tokens (", options.kv_tiers.chunk_tokens,
          ") must be a multiple of engine.block_tokens (", options.engine.block_tokens, ")"));
    }
    KvTierOptions tier_options = options.kv_tiers;
    // DRAM chunks pinned: KV moves between them and the GPU by DMA.
    if (gpu) tier_options.pin = engine::PinHostMemory;
    auto tiers = KvTierStore::Create(tier_options);
    if (!tiers.ok()) return tiers.status();
    n->tiers_ = std::move(*tiers);
  }
  DeviceArbitrationOptions arb;
  {
    auto policy = ParseArbitrationPolicy(options.arbitration_policy);
    if (!policy.ok()) return policy.status();
    arb.policy = *policy;
  }
  arb.max_queue_wait_ms = options.max_queue_wait_ms;
  arb.promote_after_slo = options.promote_after_slo;
  arb.log_decisions = options.log_arbitration;
  arb.overlap_steps = options.overlap_steps;
  arb.priority_streams = options.priority_streams;
  arb.rolling_steps = options.rolling_steps;
  arb.ahead_steps = options.ahead_steps;
  arb.poll_steps = options.engine.step_done == engine::StepDoneSignal::kWorkerPoll;
  DeviceMemoryOptions mem;
  mem.elastic = options.memory_mode == "elastic";
  mem.slab_bytes = options.slab_bytes;
  mem.remap = options.remap;
  // CUDA pages are one slab (node.memory.slab_mib; 64 MiB on GPUs): one
  // cuMemMap per page, and mapping 15 GiB of weights in 2 MiB pages was
  // measured at ~200 ms on H100 against a few ms in 64 MiB pages (weights
  // round up to a page: < 1% of an 8B model). Host devices use 64 KiB so
  // the small cpu-backend models do not round up to 2 MiB of weights each.
  mem.page_bytes = gpu ? options.slab_bytes : (64u << 10);
  for (const auto& d : options.devices) {
    mem.gpu = -1;
    if (gpu) {
      int ordinal = -1;
      if (!absl::StartsWith(d.name, "cuda:") || !absl::SimpleAtoi(d.name.substr(5), &ordinal) ||
          ordinal < 0) {
        return absl::InvalidArgumentError(absl::StrCat(
            "device \"", d.name, "\": with engine.backend cuda, devices are named cuda:N"));
      }
      mem.gpu = ordinal;
    }
    auto w = DeviceWorker::Create(d.name, d.memory_bytes, mem, arb);
    if (!w.ok()) return w.status();
    n->devices_.push_back(std::move(*w));
  }
  if (gpu && options.host_weight_cache_bytes > 0) {
    auto arena = PinHostCopyArena(options.host_weight_cache_bytes);
    if (!arena.ok()) return arena.status();
    n->host_arena_ = std::move(*arena);
  }
  return n;
}

namespace {
// A process's incarnation id: random, so a restart is told from a duplicate.
std::string NewIncarnation() {
  absl::BitGen gen;
  return absl::StrCat(absl::Hex(absl::Uniform<uint64_t>(gen), absl::kZeroPad16));
}
}  // namespace

NodeManager::NodeManager(const NodeOptions& options)
    : options_(options),
      incarnation_(NewIncarnation()),
      peer_client_(absl::Seconds(3), options.credentials),
      host_cache_(options.host_weight_cache_bytes) {}

// What the scheduler learns about a resident model.
v1::ResidentModel NodeManager::Describe(const engine::ModelEngine& e,
                                        const DeviceWorker& device) const {
  v1::ResidentModel m;
  m.set_name(e.name());
  m.set_device(device.name());
  m.set_decode_step_ms(device.DecodeStepMs(e.name()));
  m.set_state(v1::MODEL_STATE_READY);
  m.set_architecture(e.config().architecture);
  m.set_context_window(e.context_window());
  m.set_weight_bytes(e.weight_bytes());
  m.set_kv_dtype(e.kv_dtype_name());
  m.set_quantization(engine::WeightQuantName(e.config().weight_quant));
  m.set_kv_bytes_per_token(e.kv_bytes_per_token());
  absl::MutexLock lock(&mu_);
  if (auto it = lifecycle_.find(e.name()); it != lifecycle_.end()) {
    m.set_state(it->second.state);
    m.set_activation_ms(it->second.activation_ms);
    m.set_from_host_copy(it->second.from_host_copy);
  }
  return m;
}

void NodeManager::SetState(const std::string& model, v1::ModelState state) {
  absl::MutexLock lock(&mu_);
  if (state == v1::MODEL_STATE_EVICTED) {
    lifecycle_.erase(model);
  } else {
    lifecycle_[model].state = state;
  }
}

NodeManager::~NodeManager() { Shutdown(); }

void NodeManager::Shutdown() {
  if (!stop_.HasBeenNotified()) stop_.Notify();
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;  // draining evictions stop waiting
  }
  if (heartbeat_.joinable()) heartbeat_.join();
  for (auto& d : devices_) d->Stop();
}

std::vector<DeviceWorker*> NodeManager::devices() const {
  std::vector<DeviceWorker*> out;
  for (const auto& d : devices_) out.push_back(d.get());
  return out;
}

int NodeManager::inflight() const {
  absl::MutexLock lock(&mu_);
  int n = 0;
  for (const auto& [model, count] : inflight_) n += count;
  return n;
}

int NodeManager::inflight(const std::string& model) const {
  absl::MutexLock lock(&mu_);
  auto it = inflight_.find(model);
  return it == inflight_.end() ? 0 : it->second;
}

void NodeManager::RequestDone(const std::string& model) {
  absl::MutexLock lock(&mu_);
  auto it = inflight_.find(model);
  if (it != inflight_.end() && --it->second <= 0) inflight_.erase(it);
}

// A device over-full for now (its usage above its total while KV is
// mapped) is still a candidate: the load then fails for room
// (RESOURCE_EXHAUSTED, so the scheduler makes room), not as a missing device.
DeviceWorker* NodeManager::FreestDevice(const std::string& device, int64_t* best_free) const {
  DeviceWorker* target = nullptr;
  for (const auto& d : devices_) {
    if (!device.empty() && d->name() != device) continue;
    const DeviceUsage u = d->Usage();
    const int64_t free = u.memory_total_bytes - u.memory_used_bytes;
    if (target == nullptr || free > *best_free) {
      *best_free = free;
      target = d.get();
    }
  }
  return target;
}

absl::StatusOr<v1::ResidentModel> NodeManager::LoadModel(const std::string& name,
                                                         const std::string& path,
                                                         const std::string& kv_dtype,
                                                         const std::string& device,
                                                         const memory::TenantLimits& kv_limits,
                                                         const std::string& quantization) {
  if (auto st = ValidateModelName(name); !st.ok()) return st;
  if (path.empty())
    return absl::InvalidArgumentError(absl::StrCat("model ", name, ": path is empty"));
  auto quant = engine::WeightQuantFromConfig(quantization);
  if (!quant.ok())
    return absl::InvalidArgumentError(absl::StrCat("model ", name, ": ", quant.status().message()));
  absl::MutexLock serial(&load_mu_);
  chat_prompts_.Invalidate(path);  // a fixed template is read again
  std::string where;
  if (FindEngine(name, &where)) {
    return absl::AlreadyExistsError(
        absl::StrCat("model ", name, " is already resident on ", where));
  }
  int64_t best_free = 0;
  DeviceWorker* target = FreestDevice(device, &best_free);
  if (target == nullptr) {
    return absl::NotFoundError(devices_.empty()
                                   ? std::string("this node has no devices")
                                   : absl::StrCat("no device named ", device, " on this node"));
  }
  engine::ModelEngineOptions o;
  o.name = name;
  o.path = path;
  o.backend = options_.engine.backend;
  o.host_arena = host_arena_;
  o.device = std::max(target->gpu(), 0);
  o.cuda_graphs = options_.engine.cuda_graphs;
  o.deterministic = options_.engine.deterministic;
  o.gemm_tune_candidates = options_.engine.gemm_tune_candidates;
  o.warm_products = options_.engine.warm_products;
  o.step_done = options_.engine.step_done;
  if (options_.engine.sm_reserve > 0) {
    o.sm_partition = options_.engine.sm_reserve;
    o.sm_partition_rest = !absl::c_linear_search(options_.engine.sm_reserve_models, name);
    spdlog::info("model {} runs on {} (node.engine.sm_reserve {})", name,
                 o.sm_partition_rest ? "the SMs left after the reserve" : "the reserved SMs",
                 options_.engine.sm_reserve);
  }
  o.kv_dtype = kv_dtype.empty() ? "auto" : kv_dtype;
  o.quantization = engine::WeightQuantName(*quant);
  o.block_tokens = options_.engine.block_tokens;
  o.kv_cache_bytes = options_.engine.kv_cache_bytes;
  o.max_batch_tokens = options_.engine.max_batch_tokens;
  o.max_seqs = options_.engine.max_seqs;
  o.max_context = options_.engine.max_context;
  o.slow_step_warn_ms = options_.engine.slow_step_warn_ms;
  o.kv_arena = target->arena();
  o.kv_limits = kv_limits;
  if (tiers_) {
    auto fp = FingerprintOf(path);
    if (!fp.ok()) return fp.status();
    o.kv_tiers = tiers_;
    o.model_fingerprint = *fp;
    o.layerwise_kv_load = options_.kv_tiers.layerwise_load;
  }
  return Activate(o, *quant, target, best_free);
}

absl::StatusOr<v1::ResidentModel> NodeManager::Activate(const engine::ModelEngineOptions& base,
                                                        engine::WeightQuant quant,
                                                        DeviceWorker* target, int64_t best_free) {
  engine::ModelEngineOptions o = base;
  const std::string& name = o.name;
  const absl::Time t0 = absl::Now();
  {
    absl::MutexLock lock(&mu_);
    lifecycle_[name] = Lifecycle{v1::MODEL_STATE_LOADING, target->name(), 0, false};
  }
  auto fail = [&](absl::Status st) {
    SetState(name, v1::MODEL_STATE_EVICTED);
    return st;
  };
  o.host_weights = host_cache_.Get(name, o.path, quant);
  if (!target->balloon()) {
    // Static: refuse before reading the weights when they and the private
    // KV pool alone cannot fit (the workspace, known only once built, is
    // checked below). Building first put a model that did not fit on the
    // device for seconds, beyond the budget, before it was refused.
    auto weights = engine::ModelEngine::WeightBytesNeeded(o);
    if (!weights.ok()) return fail(weights.status());
    if (*weights + o.kv_cache_bytes > best_free) {
      return fail(absl::ResourceExhaustedError(
          absl::StrCat("model ", name, " needs ", *weights + o.kv_cache_bytes,
                       " bytes (weights + KV pool) before its workspace but device ",
                       target->name(), " has ", best_free, " free")));
    }
  }
  if (target->balloon()) {
    // Elastic: map the weight pages first (the device reclaims KV for them
    // on its step thread: empty slabs, then the other models shed KV), then
    // build the engine over them. A failure anywhere returns the pages.
    auto need = engine::ModelEngine::WeightBytesNeeded(o);
    if (!need.ok()) return fail(need.status());
    auto pages = target->ReserveWeights(*need);
    if (!pages.ok()) {
      return fail(absl::Status(pages.status().code(),
                               absl::StrCat("model ", name, ": ", pages.status().message())));
    }
    o.weight_pages = std::move(*pages);
  }
  o.reclaim_kv = target->ReclaimKvFor(o.name);  // the device's oldest sequence progresses
  o.prepare_remap = target->balloon() != nullptr && options_.remap.enabled;
  auto e = engine::ModelEngine::Create(o, [target] { target->Wake(); });
  if (!e.ok()) return fail(e.status());
  std::shared_ptr<engine::ModelEngine> engine = std::move(*e);
  if (!target->balloon()) {
    // Static: weights, the private pool and the workspace must fit as they
    // are (the workspace is charged as in elastic mode).
    const int64_t need = engine->weight_bytes() + o.kv_cache_bytes + engine->workspace_bytes();
    if (need > best_free) {
      return fail(absl::ResourceExhaustedError(absl::StrCat(
          "model ", name, " needs ", need, " bytes (weights + KV pool + workspace) but device ",
          target->name(), " has ", best_free, " free")));
    }
  }
  if (auto st = target->Add(engine); !st.ok()) return fail(st);
  const double ms = absl::ToDoubleMilliseconds(absl::Now() - t0);
  {
    absl::MutexLock lock(&mu_);
    lifecycle_[name] =
        Lifecycle{v1::MODEL_STATE_READY, target->name(), ms, o.host_weights != nullptr};
  }
  spdlog::info("activated model {} on {} in {:.1f} ms (weights from {}; workspace {:.1f} MiB)",
               name, target->name(), ms, o.host_weights ? "the host copy" : o.path,
               engine->workspace_bytes() / 1048576.0);
  return Describe(*engine, *target);
}

absl::Status NodeManager::EvictModel(const std::string& name, bool drain, bool keep_host_copy,
                                     absl::Duration drain_timeout) {
  std::string device;
  auto e = FindEngine(name, &device);
  if (!e) return absl::NotFoundError(absl::StrCat("model ", name, " is not resident on this node"));
  if (drain) {
    if (drain_timeout <= absl::ZeroDuration()) drain_timeout = options_.drain_timeout;
    absl::MutexLock lock(&mu_);
    lifecycle_[name].state = v1::MODEL_STATE_DRAINING;  // Submit refuses it from now on
    auto drained = [this, &name]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
      return stopping_ || !inflight_.count(name);
    };
    if (!mu_.AwaitWithTimeout(absl::Condition(&drained), drain_timeout)) {
      spdlog::warn("model {}: {} request(s) still running after the {} drain; they fail now", name,
                   inflight_[name], absl::FormatDuration(drain_timeout));
    }
  }
  if (keep_host_copy) KeepHostCopy(name, *e);
  for (auto& d : devices_) {
    if (d->Remove(name)) {
      // The memory is free when the call returns: the scheduler loads the
      // next model into it at once, and a load refused for room now would
      // evict one more model (seen in LifecycleTest under load).
      const std::string path = e->options().path;
      const engine::WeightQuant quant = e->config().weight_quant;
      d->AwaitRetired();
      e.reset();
      SetState(name, v1::MODEL_STATE_EVICTED);
      spdlog::info("evicted model {} from {}{}", name, d->name(),
                   host_cache_.Contains(name, path, quant) ? " (host copy kept)" : "");
      return absl::OkStatus();
    }
  }
  return absl::NotFoundError(absl::StrCat("model ", name, " is not resident on this node"));
}

absl::Status NodeManager::SetKvLimits(const std::string& name,
                                      const memory::TenantLimits& kv_limits) {
  auto e = FindEngine(name, nullptr);
  if (!e) return absl::NotFoundError(absl::StrCat("model ", name, " is not resident on this node"));
  return e->SetKvLimits(kv_limits);
}

std::shared_ptr<engine::ModelEngine> NodeManager::FindEngine(const std::string& model,
                                                             std::string* device) const {
  for (const auto& d : devices_) {
    if (auto e = d->Find(model)) {
      if (device) *device = d->name();
      return e;
    }
  }
  return nullptr;
}

engine::GenerationParams ToGenerationParams(const v1::SamplingParams& s,
                                            const engine::GenerationDefaults& defaults) {
  engine::GenerationParams p;
  p.max_tokens = s.max_tokens();
  engine::SamplingOptions& o = p.sampling;
  // Unset: generation_config.json's value, as vLLM applies it (do_sample
  // false there means greedy); else greedy, no top-p, no top-k.
  const bool greedy_default = defaults.do_sample.has_value() && !*defaults.do_sample;
  o.temperature =
      s.has_temperature()
          ? s.temperature()
          : (greedy_default ? 0.0f : static_cast<float>(defaults.temperature.value_or(0)));
  const float top_p = s.has_top_p() ? s.top_p() : static_cast<float>(defaults.top_p.value_or(1));
  o.top_p = top_p == 0.0f ? 1.0f : top_p;
  o.top_k = s.has_top_k() ? s.top_k() : defaults.top_k.value_or(0);
  o.min_p = s.min_p();
  o.presence_penalty = s.presence_penalty();
  o.frequency_penalty = s.frequency_penalty();
  o.repetition_penalty = s.repetition_penalty() == 0.0f ? 1.0f : s.repetition_penalty();
  o.top_logprobs = s.logprobs() ? s.top_logprobs() : -1;
  if (s.has_seed()) p.seed = s.seed();
  p.stop.assign(s.stop().begin(), s.stop().end());
  p.ignore_eos = s.ignore_eos();
  p.skip_special_tokens = !s.has_skip_special_tokens() || s.skip_special_tokens();
  return p;
}

absl::Status NodeManager::FillPrompt(const v1::NodeGenerateRequest& req, Admission* a,
                                     engine::GenerationRequest* g) {
  const engine::Tokenizer& tok = a->engine->tokenizer();
  if (!req.messages().empty()) {
    auto tokens = chat_prompts_.Render(req.model(), a->engine->options().path, tok,
                                       req.history_messages(), req.messages());
    if (!tokens.ok()) return tokens.status();
    a->turn_tokens = std::move(*tokens);
    a->replaces_history = true;
    g->prompt = a->turn_tokens;
    // The session's cached KV covers the common prefix (KvManager::TakePrefix).
    const auto& h = req.history_tokens();
    const auto mismatch = std::mismatch(h.begin(), h.end(), g->prompt.begin(), g->prompt.end());
    g->history_tokens = static_cast<int>(mismatch.first - h.begin());
  } else {
    if (req.prompt().empty()) return absl::InvalidArgumentError("prompt is empty");
    // A session's first turn gets the special tokens the tokenizer adds to a
    // sequence (BOS where its rule says so, as HF add_special_tokens=True);
    // later turns continue the history as they are.
    a->turn_tokens = tok.Encode(req.prompt(), {.add_special_tokens = req.history_tokens().empty()});
    g->prompt.assign(req.history_tokens().begin(), req.history_tokens().end());
    g->history_tokens = static_cast<int>(g->prompt.size());
    g->prompt.insert(g->prompt.end(), a->turn_tokens.begin(), a->turn_tokens.end());
  }
  return absl::OkStatus();
}

absl::StatusOr<Admission> NodeManager::Submit(const v1::NodeGenerateRequest& req,
                                              engine::GenerationSink* sink) {
  // TTFT counts from here: tokenizing, rendering and reading the KV tiers
  // (a lease from SSD or a peer) are part of it.
  const absl::Time received = absl::Now();
  Admission a;
  a.engine = FindEngine(req.model(), &a.device);
  if (!a.engine) {
    return absl::NotFoundError(
        absl::StrCat("model ", req.model(), " is not resident on node ", options_.node_id));
  }
  engine::GenerationRequest g;
  g.id = req.request_id();
  if (auto st = FillPrompt(req, &a, &g); !st.ok()) return st;
  if (!req.session_id().empty()) g.session_id = SessionKey(req.tenant(), req.session_id());
  g.tenant = req.tenant();
  if (tiers_) {
    const absl::Time t0 = absl::Now();
    g.lease = AcquireLease(*a.engine, req, g.prompt);
    g.kv_fetch_ms = absl::ToDoubleMilliseconds(absl::Now() - t0);
  }
  g.priority = req.priority();
  g.params = ToGenerationParams(req.sampling(), a.engine->tokenizer().generation_defaults());
  if (g.params.max_tokens == 0) {  // until the context window is full
    g.params.max_tokens = a.engine->context_window() - static_cast<int>(g.prompt.size());
    if (g.params.max_tokens <= 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("the prompt (", g.prompt.size(), " tokens) fills the context window of ",
                       a.engine->context_window(), " tokens of model ", req.model()));
    }
  }
  g.arrival = received - absl::Milliseconds(req.scheduler_ms());
  g.ttft_slo_ms = req.slo().ttft_ms();
  g.reject_if_slo_unmet = req.reject_if_slo_unmet();
  {
    // Counted in before the DRAINING check is released, so a draining
    // eviction either refuses this request or waits for it.
    absl::MutexLock lock(&mu_);
    auto it = lifecycle_.find(req.model());
    if (it != lifecycle_.end() && it->second.state == v1::MODEL_STATE_DRAINING) {
      return absl::UnavailableError(absl::StrCat("model ", req.model(), " is draining on node ",
                                                 options_.node_id,
                                                 "; retry (the scheduler routes elsewhere)"));
    }
    ++inflight_[req.model()];
  }
  auto* counting = new CountingSink(this, req.model(), req.session_id(), req.tenant(), sink);
  if (auto st = a.engine->Submit(std::move(g), counting); !st.ok()) {
    delete counting;
    RequestDone(req.model());
    return st;
  }
  return a;
}

std::string NodeManager::SessionKey(const std::string& tenant, const std::string& session_id) {
  // The tenant length-prefixed (an empty tenant too): no two (tenant, id)
  // pairs share a key, whatever bytes either holds.
  return absl::StrCat(tenant.size(), ":", tenant, "/", session_id);
}

std::vector<std::string> NodeManager::SessionKeys(const std::string& session_id, bool forget) {
  std::vector<std::string> keys;
  absl::MutexLock lock(&mu_);
  auto it = session_tenants_.find(session_id);
  if (it == session_tenants_.end()) return keys;
  for (const std::string& t : it->second) keys.push_back(SessionKey(t, session_id));
  if (forget) session_tenants_.erase(it);
  return keys;
}

bool NodeManager::DropSession(const std::string& session_id) {
  for (const std::string& key : SessionKeys(session_id, /*forget=*/true)) {
    for (const auto& d : devices_)
      for (const auto& e : d->Engines()) e->DropSession(key);
    if (tiers_) tiers_->DropSession(key);
  }
  absl::MutexLock lock(&mu_);
  return served_sessions_.erase(session_id) > 0;
}

void NodeManager::SessionServed(const std::string& tenant, const std::string& session_id) {
  absl::MutexLock lock(&mu_);
  served_sessions_.insert(session_id);
  session_tenants_[session_id].insert(tenant);
}

void NodeManager::SessionKept(const std::string& tenant, const std::string& session_id) {
  absl::MutexLock lock(&mu_);
  session_tenants_[session_id].insert(tenant);
}

std::vector<v1::DeviceState> NodeManager::DeviceStates() const {
  std::vector<v1::DeviceState> out;
  for (const auto& d : devices_) {
    const DeviceUsage u = d->Usage();
    v1::DeviceState s;
    s.set_name(d->name());
    s.set_memory_total_bytes(u.memory_total_bytes);
    s.set_memory_used_bytes(u.memory_used_bytes);
    s.set_kv_blocks_total(u.kv_blocks_total);
    s.set_kv_blocks_used(u.kv_blocks_total - u.kv_blocks_free);
    s.set_kv_bytes_used(u.kv_bytes_used);
    s.set_kv_bytes_free(u.kv_bytes_free);
    s.set_kv_bytes_lendable(u.remap.lendable_bytes);
    s.set_queue_length(u.waiting);
    s.set_running(u.running);
    s.set_elastic(d->balloon() != nullptr);
    for (const auto& m : u.models) s.add_resident_models(m);
    out.push_back(std::move(s));
  }
  return out;
}

std::vector<v1::ResidentModel> NodeManager::ResidentModels() const {
  std::vector<v1::ResidentModel> out;
  for (const auto& d : devices_) {
    for (const auto& e : d->Engines()) out.push_back(Describe(*e, *d));
  }
  return out;
}

}  // namespace ballast::node_manager
