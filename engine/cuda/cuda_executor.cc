#include "engine/cuda/cuda_executor.h"

#include <algorithm>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "engine/rope.h"
#include "spdlog/spdlog.h"

namespace ballast::engine::cuda {
namespace {

absl::StatusOr<KvType> KvTypeOf(DType t, ActType act) {
  switch (t) {
    case DType::kFP8E4M3:
      return KvType::kFP8E4M3;
    case DType::kBF16:
      if (act == ActType::kBF16) return KvType::kBF16;
      break;
    case DType::kF16:
      if (act == ActType::kF16) return KvType::kF16;
      break;
    default:
      break;
  }
  return absl::InvalidArgumentError(absl::StrCat(
      "kv_dtype ", ConfigName(t), " is not supported by the CUDA backend for a ",
      act == ActType::kBF16 ? "bf16" : "fp16", " model (use auto, fp8_e4m3 or the model's dtype)"));
}

}  // namespace

ActType CudaExecutor::ActivationType(const ModelConfig& config) {
  // One rule with the KV default (gpu_backend.h).
  return GpuAutoKvDType(config) == DType::kF16 ? ActType::kF16 : ActType::kBF16;
}

absl::StatusOr<std::unique_ptr<CudaExecutor>> CudaExecutor::Create(
    const ModelConfig& config, const std::string& model_dir, KvCache* kv,
    const CudaExecutorOptions& options) {
  const KvLayout& l = kv->layout();
  if (l.num_layers != config.num_hidden_layers || l.num_kv_heads != config.num_key_value_heads ||
      l.head_dim != config.head_dim) {
    return absl::InvalidArgumentError("KV layout does not match the model config");
  }
  const int d = config.head_dim;
  if (!PagedAttentionSupports(d)) {
    return absl::UnimplementedError(
        absl::StrCat("head_dim ", d,
                     " is not supported by the CUDA backend (8, 16, 32, 64, 80, 96, 128, 256: "
                     "BALLAST_ATTENTION_HEAD_DIMS in engine/cuda/kernels.h)"));
  }
  if (options.max_batch_tokens <= 0 || options.max_context <= 0) {
    return absl::InvalidArgumentError("max_batch_tokens and max_context must be > 0");
  }
  std::unique_ptr<CudaExecutor> e(new CudaExecutor(config, kv, options));
  if (auto s = e->Init(model_dir); !s.ok()) return s;
  return e;
}

CudaExecutor::CudaExecutor(const ModelConfig& config, KvCache* kv,
                           const CudaExecutorOptions& options)
    : config_(config), kv_(kv), options_(options) {}

CudaExecutor::~CudaExecutor() {
  cudaSetDevice(options_.device);
  step_waiter_.reset();  // its events are on stream_
  DropGraphs();
  if (stream_) cudaStreamSynchronize(stream_);
  if (export_stream_) cudaStreamSynchronize(export_stream_);
  for (StartedStep& slot : slots_) {
    if (slot.done) cudaEventDestroy(slot.done);
    if (slot.host) cudaFreeHost(slot.host);
  }
  if (host_penalties_) cudaFreeHost(host_penalties_);
  for (int b = 0; b < 2; ++b) {
    if (host_spans_[b]) cudaFreeHost(host_spans_[b]);
    if (kv_done_[b]) cudaEventDestroy(kv_done_[b]);
  }
  if (export_stream_) cudaStreamDestroy(export_stream_);
  if (export_after_) cudaEventDestroy(export_after_);
  if (load_stream_) cudaStreamSynchronize(load_stream_);
  if (load_host_spans_) cudaFreeHost(load_host_spans_);
  for (cudaEvent_t e : layer_loaded_) cudaEventDestroy(e);
  if (load_after_) cudaEventDestroy(load_after_);
  if (load_stream_) cudaStreamDestroy(load_stream_);
  if (weight_stream_) cudaStreamSynchronize(weight_stream_);
  for (cudaEvent_t e : weight_loaded_) cudaEventDestroy(e);
  for (cudaEvent_t e : slot_free_) cudaEventDestroy(e);
  for (int set = 0; set < 2; ++set) {
    for (cudaEvent_t e : reached_[set]) cudaEventDestroy(e);
    for (cudaEvent_t e : copied_[set]) cudaEventDestroy(e);
  }
  if (weight_stream_) cudaStreamDestroy(weight_stream_);
  for (cudaStream_t st : streams_) {
    if (st) cudaStreamSynchronize(st);
    if (st) cudaStreamDestroy(st);
  }
  if (stream_switch_) cudaEventDestroy(stream_switch_);
}

void CudaExecutor::NotifyWhenStepDone(std::function<void()> done) {
  if (started_ == 0) {
    done();
    return;
  }
  if (options_.step_done != StepDoneSignal::kHostFunction) {
    if (!step_waiter_) {
      step_waiter_ = std::make_unique<StepDoneWaiter>(
          options_.device, options_.step_done == StepDoneSignal::kSpinningThread);
    }
    if (step_waiter_->NotifyAfter(stream_, done) == cudaSuccess) return;
    cudaGetLastError();  // the host function below, or the caller's own wait
  }
  auto* fn = new std::function<void()>(std::move(done));
  const cudaError_t err = cudaLaunchHostFunc(
      stream_,
      [](void* p) {
        auto* f = static_cast<std::function<void()>*>(p);
        (*f)();
        delete f;
      },
      fn);
  if (err != cudaSuccess) {  // the step's end will be waited for instead
    cudaGetLastError();
    (*fn)();
    delete fn;
  }
}

namespace {
// Whether `e`'s work has ended (an error ends the wait too: the step's
// finish returns it).
bool EventEnded(cudaEvent_t e) {
  const cudaError_t err = cudaEventQuery(e);
  if (err != cudaSuccess && err != cudaErrorNotReady) cudaGetLastError();
  return err != cudaErrorNotReady;
}
}  // namespace

bool CudaExecutor::StartedStepsEnded() const {
  return started_ == 0 || EventEnded(slots_[(oldest_ + started_ - 1) % 2].done);
}

bool CudaExecutor::OldestStartedStepEnded() const {
  return started_ == 0 || EventEnded(slots_[oldest_].done);
}

absl::Status CudaExecutor::SetUrgent(bool urgent) {
  cudaStream_t want = streams_[urgent ? 1 : 0];
  if (want == stream_ || want == nullptr) return absl::OkStatus();
  BALLAST_CUDA_RETURN(cudaSetDevice(options_.device), "cudaSetDevice");
  BALLAST_CUDA_RETURN(cudaEventRecord(stream_switch_, stream_), "stream switch");
  BALLAST_CUDA_RETURN(cudaStreamWaitEvent(want, stream_switch_, 0), "stream switch");
  stream_ = want;
  return absl::OkStatus();
}

size_t CudaExecutor::AttentionWorkspaceBytes() {
  const ModelConfig& c = config_;
  const int T = options_.max_batch_tokens;
  if (options_.deterministic) {
    // Partitions of a fixed length: the shortest (from 512 keys) whose
    // workspace for a full step stays within 256 MiB.
    constexpr size_t kBudget = 256u << 20;
    fixed_partition_tokens_ = 512;
    auto bytes = [&] {
      return PagedAttentionWorkspaceBytes(
          PlanPagedAttentionFixed(T, options_.max_context, fixed_partition_tokens_),
          c.num_attention_heads, c.head_dim);
    };
    while (bytes() > kBudget && fixed_partition_tokens_ < options_.max_context) {
      fixed_partition_tokens_ *= 2;
    }
    return bytes();
  }
  return MaxPagedAttentionWorkspaceBytes(T, c.num_attention_heads, c.num_key_value_heads,
                                         c.head_dim, options_.max_context, num_sms_,
                                         attention_blocks_per_sm_);
}

absl::Status CudaExecutor::Init(const std::string& model_dir) {
  BALLAST_CUDA_RETURN(cudaSetDevice(options_.device), "cudaSetDevice");
  BALLAST_CUDA_RETURN(
      cudaDeviceGetAttribute(&num_sms_, cudaDevAttrMultiProcessorCount, options_.device),
      "device query");
  int least = 0, greatest = 0;
  BALLAST_CUDA_RETURN(cudaDeviceGetStreamPriorityRange(&least, &greatest), "stream priorities");
  if (options_.sm_partition > 0) {  // the step streams on a partition's SMs
    auto part =
        SmPartition::Create(options_.device, options_.sm_partition, options_.sm_partition_rest);
    if (!part.ok()) return part.status();
    partition_ = std::move(*part);
    num_sms_ = partition_->sm_count();  // attention plans split over these
    for (int i = 0; i < 2; ++i) {
      auto s = partition_->NewStream(i == 0 ? least : greatest);
      if (!s.ok()) return s.status();
      streams_[i] = *s;
    }
  } else {
    BALLAST_CUDA_RETURN(cudaStreamCreateWithPriority(&streams_[0], cudaStreamNonBlocking, least),
                        "stream");
    BALLAST_CUDA_RETURN(cudaStreamCreateWithPriority(&streams_[1], cudaStreamNonBlocking, greatest),
                        "stream");
  }
  BALLAST_CUDA_RETURN(cudaEventCreateWithFlags(&stream_switch_, cudaEventDisableTiming),
                      "stream event");
  stream_ = streams_[0];
  for (StartedStep& slot : slots_) {
    BALLAST_CUDA_RETURN(cudaEventCreateWithFlags(&slot.done, cudaEventDisableTiming), "step event");
  }
  act_ = ActivationType(config_);
  // Deterministic mode: every token through the split-KV kernel, whose
  // per-query reduction does not depend on how the prompt was chunked.
  prefill_kernel_ok_ = !options_.deterministic && PrefillAttentionSupports(config_.head_dim);
  auto kt = KvTypeOf(kv_->layout().dtype, act_);
  if (!kt.ok()) return kt.status();
  kv_type_ = *kt;
  BALLAST_CUDA_RETURN(
      PagedAttentionBlocksPerSm(config_.num_attention_heads, config_.num_key_value_heads,
                                config_.head_dim, kv_type_, act_, &attention_blocks_per_sm_),
      "attention occupancy");
  if (attention_blocks_per_sm_ < 1) {
    return absl::FailedPreconditionError(absl::StrCat("the attention kernel for head size ",
                                                      config_.head_dim, " cannot run on device ",
                                                      options_.device, " (no block fits an SM)"));
  }
  BALLAST_CUDA_RETURN(PagedAttentionStreamBlocksPerSm(config_.head_dim, kv_type_, act_,
                                                      &attention_stream_blocks_per_sm_),
                      "stream attention occupancy");
  if (config_.weight_quant == WeightQuant::kFp8) {
    int major = 0, minor = 0;
    cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, options_.device);
    cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, options_.device);
    if (major * 10 + minor < 89) {
      return absl::FailedPreconditionError(absl::StrCat(
          "quantization fp8 needs FP8 tensor cores (compute capability 8.9 or later); device ",
          options_.device, " is ", major, ".", minor));
    }
  }
  if (config_.weight_quant == WeightQuant::kFp8 &&
      (config_.hidden_size % 16 != 0 || config_.q_dim() % 16 != 0 ||
       config_.intermediate_size % 16 != 0)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "quantization fp8 needs hidden_size, heads x head_dim and intermediate_size to be "
        "multiples of 16 (FP8 GEMMs); this model has ",
        config_.hidden_size, ", ", config_.q_dim(), " and ", config_.intermediate_size));
  }
  const WeightDest dest{options_.weights_at, options_.weights_capacity};
  absl::StatusOr<std::unique_ptr<DeviceWeights>> w;
  if (options_.host_weights) {
    const auto* image = dynamic_cast<const PinnedWeights*>(options_.host_weights.get());
    if (image == nullptr) {
      return absl::InvalidArgumentError("host weight copy was not made by the CUDA backend");
    }
    w = DeviceWeights::LoadFromHost(*image, config_, act_, options_.copy_streams, dest);
  } else {
    w = DeviceWeights::Load(model_dir, config_, act_, stream_, dest);
  }
  if (!w.ok()) return w.status();
  weights_ = std::move(*w);
  constexpr size_t kGemmWorkspace = 32u << 20;
  // FP8 weights: x of up to max_batch_tokens rows is quantized before each product.
  const bool fp8 = config_.weight_quant == WeightQuant::kFp8;
  const int fp8_rows = fp8 ? options_.max_batch_tokens : 0;
  const int fp8_k =
      fp8 ? std::max({config_.hidden_size, config_.q_dim(), config_.intermediate_size}) : 0;
  workspace_bytes_ = kGemmWorkspace + (fp8 ? Gemm::Fp8ScratchBytes(fp8_rows, fp8_k) : 0);
  GemmOptions go;
  go.workspace_bytes = kGemmWorkspace;
  go.skinny_max_m = options_.skinny_gemm_max_m;
  go.skinny_fp8_max_m = options_.skinny_fp8_max_m;
  go.skinny_mma_max_m = options_.skinny_mma_max_m;
  go.skinny_mma_2byte = options_.skinny_mma_2byte;
  go.fp8_rows = fp8_rows;
  go.fp8_max_k = fp8_k;
  go.batch_invariant = options_.deterministic;
  go.tune_candidates = options_.gemm_tune_candidates;
  auto g = Gemm::Create(go);
  if (!g.ok()) return g.status();
  gemm_ = std::move(*g);

  const ModelConfig& c = config_;
  const size_t T = options_.max_batch_tokens, a = ActSize(act_);
  max_rows_ = options_.max_seqs > 0
                  ? std::min(GraphBucketTokens(options_.max_seqs), options_.max_batch_tokens)
                  : options_.max_batch_tokens;
  const size_t R = static_cast<size_t>(max_rows_);
  const size_t H = c.hidden_size, Q = c.q_dim(), KV = c.kv_dim(), I = c.intermediate_size;
  inv_freq_host_ = RopeInverseFrequencies(c);
  struct Alloc {
    DeviceBuffer* buf;
    size_t bytes;
    const char* what;
  };
  const size_t ws = AttentionWorkspaceBytes();
  const Alloc allocs[] = {
      {&inv_freq_, inv_freq_host_.size() * sizeof(float), "rope table"},
      {&resid_, T * H * sizeof(float), "residual stream"},
      {&x_, T * H * a, "activations"},
      {&qkv_, T * (Q + 2 * KV) * a, "qkv"},
      {&q_, T * Q * a, "queries"},
      {&attn_, T * Q * a, "attention output"},
      {&o_, T * H * a, "projections"},
      {&gate_up_, T * 2 * I * a, "gate/up"},
      {&act_buf_, T * I * a, "mlp activations"},
      {&x_sel_, R * H * a, "logit rows"},
      {&logits_, R * static_cast<size_t>(c.vocab_size) * sizeof(float), "logits"},
      {&attn_ws_, ws, "attention workspace"},
      {&attn_counts_, T * c.num_attention_heads * sizeof(unsigned), "attention merge counts"},
      {&norm_ss_,
       static_cast<size_t>(kSkinnyNormMaxM) *
           SkinnyNormBlocks(kSkinnyNormMaxM, static_cast<int>(H)) * sizeof(float),
       "folded norm sums"},
  };
  for (const Alloc& al : allocs) {
    if (auto s = al.buf->Allocate(al.bytes, al.what); !s.ok()) return s;
    workspace_bytes_ += static_cast<int64_t>(al.bytes);
  }
  // Zero once: each attention launch leaves its counts zero
  // (LaunchPagedAttention).
  BALLAST_CUDA_RETURN(
      cudaMemset(attn_counts_.get(), 0, T * c.num_attention_heads * sizeof(unsigned)),
      "attention merge counts");
  BALLAST_CUDA_RETURN(cudaMemcpy(inv_freq_.get(), inv_freq_host_.data(),
                                 inv_freq_host_.size() * sizeof(float), cudaMemcpyHostToDevice),
                      "rope table");
  max_table_blocks_ =
      (options_.max_context + kv_->layout().block_tokens - 1) / kv_->layout().block_tokens;
  // Every array starts 256-byte aligned (SampleParams holds 8-byte fields).
  auto align = [](size_t x) { return (x + 255) / 256 * 256; };
  stream_offset_ = align(7 * T * sizeof(int));
  params_offset_ = align(stream_offset_ + static_cast<size_t>(num_sms_) * attention_blocks_per_sm_ *
                                              sizeof(AttentionStreamStart));
  tiles_offset_ = align(params_offset_ + T * sizeof(SampleParams));
  out_offset_ = align(tiles_offset_ + T * sizeof(PrefillTile));
  logprobs_offset_ = align(out_offset_ + T * sizeof(int));
  table_offset_ = align(logprobs_offset_ + T * sizeof(SampleLogprobs));
  meta_bytes_ = table_offset_ +
                static_cast<size_t>(c.num_hidden_layers) * R * max_table_blocks_ * sizeof(int);
  if (auto s = meta_.Allocate(meta_bytes_, "step metadata"); !s.ok()) return s;
  workspace_bytes_ += static_cast<int64_t>(meta_bytes_);
  for (StartedStep& slot : slots_) {
    BALLAST_CUDA_RETURN(cudaMallocHost(&slot.host, meta_bytes_), "pinned step metadata");
  }
  host_meta_ = slots_[0].host;
  // Room for the penalty entries of a typical step; more is allocated on
  // demand (ReservePenalties).
  constexpr size_t kInitialPenalties = 16384;
  if (auto s = ReservePenalties(kInitialPenalties); !s.ok()) return s;
  if (auto s = InitKvStaging(); !s.ok()) return s;
  return options_.warm_products ? WarmProducts() : absl::OkStatus();
}

absl::StatusOr<std::shared_ptr<const HostWeights>> CudaExecutor::KeepHostWeights() {
  // The image layer streaming copies from is the same bytes: no new copy.
  // (May run beside a step: the step thread may be setting it.)
  if (auto image = std::atomic_load(&host_image_)) return std::shared_ptr<const HostWeights>(image);
  BALLAST_CUDA_RETURN(cudaSetDevice(options_.device), "cudaSetDevice");
  auto img = weights_->SaveToHost(options_.host_arena);
  if (!img.ok()) return img.status();
  return std::shared_ptr<const HostWeights>(std::move(*img));
}

absl::Status CudaExecutor::Run(const StepShape& sh) {
  HarvestStall();  // the previous step's, before its events are recorded again
  const int timed_set = stream_plan_.alpha > 0 ? 0 : -1;  // direct runs, warm-ups
  if (stream_plan_.alpha > 0) {  // every streamed layer is copied once per step,
    // but for homes whose slot holds no other layer (α < slots)
    const int copies = static_cast<int>(stream_plan_.streamed.size()) -
                       std::max(0, stream_plan_.slots - stream_plan_.alpha);
    streamed_bytes_.fetch_add(copies * static_cast<int64_t>(weights_->layer_extent(0).bytes),
                              std::memory_order_relaxed);
  }
  if (!sh.graph) {
    absl::Status st = Enqueue(sh);
    if (st.ok()) load_pending_ = false;  // every layer waited for its load
    if (st.ok()) stall_set_ = timed_set;
    return st;
  }
  const GraphKey key{sh.tokens,
                     sh.max_blocks,
                     sh.sample,
                     sh.attention.partition_tokens,
                     sh.attention.num_partitions,
                     sh.attention.workspace_rows,
                     sh.attention.streamed_ctas};
  auto it = graphs_.find(key);
  if (it == graphs_.end()) {
    // Plans (cuBLASLt heuristics) are made on a first, uncaptured run,
    // which computes this step. The capture is not made to wait for it (nor
    // for the step queued before it): a server meets a new bucket every
    // few dozen steps while its batch grows or drains, and a wait there
    // left the device idle through the capture and instantiation (on an
    // H200, 8B offline: 164 ms more over a run's 19 bucket changes with
    // the wait, 15-45 ms without; docs/benchmarks.md, "Products warmed at
    // activation"). The device runs the queued steps meanwhile.
    const absl::Time t0 = absl::Now();
    if (auto s = Enqueue(sh); !s.ok()) return s;
    const absl::Time t1 = absl::Now();
    // Relaxed: other threads' calls meanwhile (a StepDoneWaiter's event
    // waits, other engines' launches) neither fail nor end the capture.
    BALLAST_CUDA_RETURN(cudaStreamBeginCapture(stream_, cudaStreamCaptureModeRelaxed),
                        "graph capture");
    absl::Status st = Enqueue(sh);
    cudaGraph_t graph = nullptr;
    const cudaError_t end = cudaStreamEndCapture(stream_, &graph);
    if (!st.ok()) {
      if (graph) cudaGraphDestroy(graph);
      return st;
    }
    BALLAST_CUDA_RETURN(end, "graph capture");
    const absl::Time t2 = absl::Now();
    cudaGraphExec_t exec = nullptr;
    const cudaError_t inst = cudaGraphInstantiate(&exec, graph, 0);
    cudaGraphDestroy(graph);
    BALLAST_CUDA_RETURN(inst, "graph instantiate");
    graphs_.emplace(key, exec);
    // Where a new graph's host time goes (a step that meets one takes
    // tens of ms to launch on an 8B model; docs/benchmarks.md).
    spdlog::info(
        "decode graph {} for {} rows ({} blocks, {} partitions): eager run {:.2f} ms, "
        "capture {:.2f} ms, instantiate {:.2f} ms",
        graphs_.size(), sh.tokens, sh.max_blocks, sh.attention.num_partitions,
        absl::ToDoubleMilliseconds(t1 - t0), absl::ToDoubleMilliseconds(t2 - t1),
        absl::ToDoubleMilliseconds(absl::Now() - t2));
    stall_set_ = timed_set;
    return absl::OkStatus();  // the warm-up run already computed this step
  }
  BALLAST_CUDA_RETURN(cudaGraphLaunch(it->second, stream_), "graph launch");
  stall_set_ = timed_set < 0 ? -1 : 1;
  ++graph_replays_;
  last_graph_rows_ = sh.tokens;
  return absl::OkStatus();
}

absl::Status CudaExecutor::Forward(absl::Span<const SequenceChunk> batch,
                                   std::vector<float>* logits) {
  if (started_ > 0) return absl::FailedPreconditionError("a sampled step is in flight");
  BALLAST_CUDA_RETURN(cudaSetDevice(options_.device), "cudaSetDevice");
  host_meta_ = slots_[oldest_].host;
  auto sh = Stage(batch, {}, false);
  if (!sh.ok()) return sh.status();
  if (auto s = Run(*sh); !s.ok()) return s;
  const size_t n = static_cast<size_t>(sh->real_rows) * config_.vocab_size;
  logits->resize(n);
  BALLAST_CUDA_RETURN(cudaMemcpyAsync(logits->data(), logits_.get(), n * sizeof(float),
                                      cudaMemcpyDeviceToHost, stream_),
                      "logits download");
  BALLAST_CUDA_RETURN(cudaStreamSynchronize(stream_), "step");
  HarvestStall();
  return absl::OkStatus();
}

absl::Status CudaExecutor::ForwardSample(absl::Span<const SequenceChunk> batch,
                                         absl::Span<const DeviceSampling> sampling,
                                         std::vector<int>* tokens,
                                         std::vector<TokenLogprobs>* logprobs) {
  const bool want_logprobs =
      logprobs != nullptr && std::any_of(sampling.begin(), sampling.end(),
                                         [](const auto& s) { return s.options.top_logprobs >= 0; });
  if (auto st = StartForwardSample(batch, sampling, want_logprobs); !st.ok()) return st;
  return FinishForwardSample(tokens, logprobs);
}

absl::Status CudaExecutor::StartForwardSample(absl::Span<const SequenceChunk> batch,
                                              absl::Span<const DeviceSampling> sampling,
                                              bool want_logprobs) {
  if (started_ >= 2) return absl::FailedPreconditionError("two sampled steps are in flight");
  BALLAST_CUDA_RETURN(cudaSetDevice(options_.device), "cudaSetDevice");
  // The other mirror than a step in flight's: that one is still read by
  // its uploads and written by its downloads.
  StartedStep& slot = slots_[(oldest_ + started_) % 2];
  host_meta_ = slot.host;
  auto sh = Stage(batch, sampling, true);
  if (!sh.ok()) return sh.status();
  if (auto s = Run(*sh); !s.ok()) return s;
  auto* host = static_cast<uint8_t*>(slot.host);
  BALLAST_CUDA_RETURN(cudaMemcpyAsync(host + out_offset_, meta_.get<uint8_t>() + out_offset_,
                                      sh->real_rows * sizeof(int), cudaMemcpyDeviceToHost, stream_),
                      "token download");
  slot.top.clear();
  if (want_logprobs) {
    BALLAST_CUDA_RETURN(
        cudaMemcpyAsync(host + logprobs_offset_, meta_.get<uint8_t>() + logprobs_offset_,
                        sh->real_rows * sizeof(SampleLogprobs), cudaMemcpyDeviceToHost, stream_),
        "logprobs download");
    for (const DeviceSampling& s : sampling) slot.top.push_back(s.options.top_logprobs >= 0);
  }
  // The host waits on this event alone (pinned results, no stream or
  // device-wide sync), so other executors' streams keep running.
  BALLAST_CUDA_RETURN(cudaEventRecord(slot.done, stream_), "step event");
  slot.rows = sh->real_rows;
  last_sampled_rows_ = sh->real_rows;
  ++started_;
  return absl::OkStatus();
}

absl::Status CudaExecutor::FinishForwardSample(std::vector<int>* tokens,
                                               std::vector<TokenLogprobs>* logprobs) {
  if (started_ == 0) return absl::FailedPreconditionError("no sampled step was started");
  const StartedStep& slot = slots_[oldest_];
  oldest_ = (oldest_ + 1) % 2;
  --started_;
  BALLAST_CUDA_RETURN(cudaEventSynchronize(slot.done), "step");
  HarvestStall();
  const auto* host = static_cast<const uint8_t*>(slot.host);
  const int* out = reinterpret_cast<const int*>(host + out_offset_);
  tokens->assign(out, out + slot.rows);
  if (logprobs != nullptr) {
    logprobs->assign(slot.rows, TokenLogprobs{});
    if (!slot.top.empty()) ReadLogprobs(host, slot.top, slot.rows, logprobs);
  }
  return absl::OkStatus();
}

void CudaExecutor::ReadLogprobs(const uint8_t* host, const std::vector<bool>& wanted, int rows,
                                std::vector<TokenLogprobs>* logprobs) const {
  const auto* src = reinterpret_cast<const SampleLogprobs*>(host + logprobs_offset_);
  for (int i = 0; i < rows; ++i) {
    if (!wanted[i]) continue;
    TokenLogprobs& lp = (*logprobs)[i];
    lp.logprob = src[i].chosen;
    lp.top.clear();
    for (int k = 0; k < src[i].count; ++k) lp.top.push_back({src[i].ids[k], src[i].logprobs[k]});
  }
}

}  // namespace ballast::engine::cuda
