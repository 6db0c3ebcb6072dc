#include "engine/cpu/cpu_executor.h"

#include <algorithm>
#include <cmath>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "engine/sampler.h"

namespace ballast::engine {
namespace {

// The tensors of one decoder layer, in a fixed order.
std::vector<const Matrix*> LayerTensors(const LayerWeights& l) {
  return {&l.input_norm, &l.q,         &l.k,      &l.v,      &l.o,
          &l.q_bias,     &l.k_bias,    &l.v_bias, &l.o_bias, &l.q_norm,
          &l.k_norm,     &l.post_norm, &l.gate,   &l.up,     &l.down};
}

int64_t LayerFloats(const LayerWeights& l) {
  int64_t n = 0;
  for (const Matrix* m : LayerTensors(l)) n += static_cast<int64_t>(m->data.size());
  return n;
}

}  // namespace

CpuHostWeights::CpuHostWeights(std::shared_ptr<const ModelWeights> w) : weights_(std::move(w)) {
  auto add = [&](const Matrix& m) {
    bytes_ += static_cast<int64_t>(m.data.size() * sizeof(float));
  };
  add(weights_->embed);
  add(weights_->final_norm);
  add(weights_->lm_head);
  for (const LayerWeights& l : weights_->layers) {
    bytes_ += LayerFloats(l) * static_cast<int64_t>(sizeof(float));
  }
}
namespace {

// Dot product with four partial sums (fixed order: deterministic).
inline float Dot(const float* a, const float* b, int n) {
  float s0 = 0, s1 = 0, s2 = 0, s3 = 0;
  int i = 0;
  for (; i + 4 <= n; i += 4) {
    s0 += a[i] * b[i];
    s1 += a[i + 1] * b[i + 1];
    s2 += a[i + 2] * b[i + 2];
    s3 += a[i + 3] * b[i + 3];
  }
  for (; i < n; ++i) s0 += a[i] * b[i];
  return (s0 + s1) + (s2 + s3);
}

// y[t, :] = x[t, :] W^T (+ bias) for t in [0, T). W is [out, in].
void Linear(const Matrix& w, const Matrix* bias, const float* x, int T, float* y) {
  const int in = w.cols, out = w.rows;
  for (int o = 0; o < out; ++o) {
    const float* row = w.row(o);
    const float b = (bias != nullptr && !bias->data.empty()) ? bias->data[o] : 0.0f;
    for (int t = 0; t < T; ++t)
      y[static_cast<size_t>(t) * out + o] = Dot(row, x + static_cast<size_t>(t) * in, in) + b;
  }
}

// HF LlamaRMSNorm: x / sqrt(mean(x^2) + eps) * weight, in float32.
void RmsNorm(const float* x, const Matrix& w, double eps, int n, float* y) {
  float ss = 0.0f;
  for (int i = 0; i < n; ++i) ss += x[i] * x[i];
  const float inv = 1.0f / std::sqrt(ss / static_cast<float>(n) + static_cast<float>(eps));
  for (int i = 0; i < n; ++i) y[i] = w.data[i] * (x[i] * inv);
}

// Qwen3's q_norm / k_norm: RmsNorm over each of the `rows` head vectors
// of size d in [rows][d], in place.
void HeadRmsNorm(float* x, int rows, int d, const Matrix& w, double eps) {
  for (int r = 0; r < rows; ++r) {
    float* v = x + static_cast<size_t>(r) * d;
    RmsNorm(v, w, eps, d, v);
  }
}

// The step's tokens flattened: token t belongs to chunk owner[t] at
// position pos[t].
struct FlatBatch {
  std::vector<int> tok, pos, owner;
};

absl::StatusOr<FlatBatch> Flatten(absl::Span<const SequenceChunk> batch, int vocab,
                                  int block_tokens) {
  FlatBatch f;
  for (size_t b = 0; b < batch.size(); ++b) {
    const SequenceChunk& ch = batch[b];
    const int end = ch.start_pos + static_cast<int>(ch.tokens.size());
    if (ch.kv->capacity_tokens(block_tokens) < end) {
      return absl::InternalError(absl::StrCat("chunk ", b, ": KV capacity below position ", end));
    }
    for (size_t i = 0; i < ch.tokens.size(); ++i) {
      const int id = ch.tokens[i];
      if (id < 0 || id >= vocab) {
        return absl::InvalidArgumentError(absl::StrCat("token id ", id, " outside the vocabulary"));
      }
      f.tok.push_back(id);
      f.pos.push_back(ch.start_pos + static_cast<int>(i));
      f.owner.push_back(static_cast<int>(b));
    }
  }
  return f;
}

// Causal attention of one query head over its sequence's cached positions
// [0, n): out[d] = softmax(q . K^T * scale) V, read from KV head kvh.
void AttendHead(const KvCache& kv, const SequenceKv& seq, int layer, int kvh, int n, int d,
                const float* q, float* out, std::vector<float>* scratch) {
  std::vector<float>& scores = *scratch;
  scores.resize(static_cast<size_t>(n) + 2 * d);
  float* kbuf = scores.data() + n;
  float* vbuf = kbuf + d;
  const float scale = 1.0f / std::sqrt(static_cast<float>(d));
  float mx = -INFINITY;
  for (int j = 0; j < n; ++j) {
    kv.ReadK(seq, layer, j, kvh, kbuf);
    scores[j] = Dot(q, kbuf, d) * scale;
    mx = std::max(mx, scores[j]);
  }
  float sum = 0.0f;
  for (int j = 0; j < n; ++j) {
    scores[j] = std::exp(scores[j] - mx);
    sum += scores[j];
  }
  std::fill_n(out, d, 0.0f);
  for (int j = 0; j < n; ++j) {
    kv.ReadV(seq, layer, j, kvh, vbuf);
    const float p = scores[j] / sum;
    for (int e = 0; e < d; ++e) out[e] += p * vbuf[e];
  }
}

}  // namespace

absl::StatusOr<std::unique_ptr<CpuExecutor>> CpuExecutor::Create(
    const ModelConfig& config, std::shared_ptr<const ModelWeights> weights, KvCache* kv,
    bool sample_in_step) {
  const KvLayout& l = kv->layout();
  if (l.num_layers != config.num_hidden_layers || l.num_kv_heads != config.num_key_value_heads ||
      l.head_dim != config.head_dim) {
    return absl::InvalidArgumentError("KV layout does not match the model config");
  }
  if (static_cast<int>(weights->layers.size()) != config.num_hidden_layers) {
    return absl::InvalidArgumentError("weights do not match the model config");
  }
  return std::unique_ptr<CpuExecutor>(
      new CpuExecutor(config, std::move(weights), kv, sample_in_step));
}

CpuExecutor::CpuExecutor(const ModelConfig& config, std::shared_ptr<const ModelWeights> weights,
                         KvCache* kv, bool sample_in_step)
    : config_(config),
      sample_in_step_(sample_in_step),
      weights_(std::move(weights)),
      kv_(kv),
      inv_freq_(RopeInverseFrequencies(config)) {}

void CpuExecutor::ApplyRope(float* vec, int num_heads, int pos) const {
  // HF rotate_half convention: pairs (i, i + d/2).
  const int d = config_.head_dim, half = d / 2;
  for (int i = 0; i < half; ++i) {
    const float angle = static_cast<float>(pos) * inv_freq_[i];
    const float c = std::cos(angle), s = std::sin(angle);
    for (int h = 0; h < num_heads; ++h) {
      float* x = vec + static_cast<size_t>(h) * d;
      const float x1 = x[i], x2 = x[i + half];
      x[i] = x1 * c - x2 * s;
      x[i + half] = x2 * c + x1 * s;
    }
  }
}

absl::Status CpuExecutor::Forward(absl::Span<const SequenceChunk> batch,
                                  std::vector<float>* logits) {
  const ModelConfig& c = config_;
  const int H = c.hidden_size;
  auto flat = Flatten(batch, c.vocab_size, kv_->layout().block_tokens);
  if (!flat.ok()) return flat.status();
  const int T = static_cast<int>(flat->tok.size());
  std::vector<float> x(static_cast<size_t>(T) * H);
  for (int t = 0; t < T; ++t)
    std::copy_n(weights_->embed.row(flat->tok[t]), H, x.data() + static_cast<size_t>(t) * H);
  for (int l = 0; l < c.num_hidden_layers; ++l) {
    if (loader_) loader_->WaitLayer(l);  // a lease's KV of this layer is in
    const int slot = streamer_ ? streamer_->Acquire(l) : -1;
    const LayerWeights& L = slot >= 0 ? slots_[static_cast<size_t>(slot)] : weights_->layers[l];
    AttentionBlock(l, L, batch, flat->pos, flat->owner, &x);
    MlpBlock(L, T, &x);
    if (streamer_) streamer_->Release(l);
  }
  ComputeLogits(batch, x, logits);
  return absl::OkStatus();
}

absl::Status CpuExecutor::ForwardSample(absl::Span<const SequenceChunk> batch,
                                        absl::Span<const DeviceSampling> sampling,
                                        std::vector<int>* tokens,
                                        std::vector<TokenLogprobs>* logprobs) {
  if (!sample_in_step_) return Executor::ForwardSample(batch, sampling, tokens, logprobs);
  std::vector<float> logits;
  if (auto st = Forward(batch, &logits); !st.ok()) return st;
  const int vocab = config_.vocab_size;
  const size_t rows = logits.size() / static_cast<size_t>(vocab);
  if (rows != sampling.size()) {
    return absl::InvalidArgumentError(
        absl::StrCat(sampling.size(), " sampling entries for ", rows, " rows"));
  }
  tokens->clear();
  if (logprobs != nullptr) logprobs->assign(rows, TokenLogprobs{});
  for (size_t r = 0; r < rows; ++r) {
    const DeviceSampling& s = sampling[r];
    // One generator per draw, from (seed, counter) only.
    std::mt19937_64 rng(s.seed ^ ((s.counter + 1) * 0x9E3779B97F4A7C15ull));
    const bool want = logprobs != nullptr && s.options.top_logprobs >= 0;
    tokens->push_back(SampleToken(logits.data() + r * vocab, vocab, s.options, s.penalties, rng,
                                  want ? &(*logprobs)[r] : nullptr));
  }
  return absl::OkStatus();
}

std::vector<LayerExtent> CpuExecutor::LayerExtents() const {
  const ModelWeights& w = *weights_;
  int64_t floats =
      static_cast<int64_t>(w.embed.data.size() + w.final_norm.data.size() + w.lm_head.data.size());
  for (const LayerWeights& l : w.layers) floats += LayerFloats(l);
  if (floats == 0) return {};
  // Stored bytes per float (2 for BF16 checkpoints); extents in file order.
  const double scale = static_cast<double>(w.stored_bytes) / static_cast<double>(floats);
  std::vector<LayerExtent> out;
  double at = static_cast<double>(w.embed.data.size()) * scale;
  for (const LayerWeights& l : w.layers) {
    const double bytes = static_cast<double>(LayerFloats(l)) * scale;
    out.push_back({static_cast<size_t>(at), static_cast<size_t>(bytes)});
    at += bytes;
  }
  return out;
}

absl::Status CpuExecutor::SetLayerStreaming(const memory::StreamingPlan& plan) {
  const int n = config_.num_hidden_layers;
  if (plan.alpha > 0) {
    const int m = static_cast<int>(plan.streamed.size());
    if (plan.slots < 1 || m != plan.alpha + plan.slots || m > n ||
        !std::is_sorted(plan.streamed.begin(), plan.streamed.end()) || plan.streamed.front() < 0 ||
        plan.streamed.back() >= n) {
      return absl::InvalidArgumentError(
          absl::StrCat("streaming plan for ", n, " layers is malformed (alpha ", plan.alpha,
                       ", slots ", plan.slots, ", ", m, " streamed)"));
    }
  }
  if (streamer_) {
    const transfer::LayerStreamerStats st = streamer_->stats();
    retired_.stall_seconds += st.stall_seconds;
    streamer_.reset();  // finishes its copies
  }
  slots_.clear();
  if (plan.alpha == 0) return absl::OkStatus();
  // Slot s starts with its home layer, streamed[s].
  slots_.resize(static_cast<size_t>(plan.slots));
  for (int s = 0; s < plan.slots; ++s) {
    slots_[static_cast<size_t>(s)] = weights_->layers[plan.streamed[static_cast<size_t>(s)]];
  }
  const int64_t layer_bytes =
      LayerFloats(weights_->layers[0]) * static_cast<int64_t>(sizeof(float));
  streamer_ = std::make_unique<transfer::LayerStreamer>(
      plan.streamed, plan.slots, n, [this, layer_bytes](int slot, int layer) {
        // Assignment reuses the slot's buffers: one copy, no allocation.
        slots_[static_cast<size_t>(slot)] = weights_->layers[layer];
        slot_bytes_.fetch_add(layer_bytes, std::memory_order_relaxed);
      });
  return absl::OkStatus();
}

absl::Status CpuExecutor::RestoreLayers(absl::Span<const int> layers) {
  // The heap tensors were never lost: only the pages standing for them.
  for (int l : layers) {
    if (l < 0 || l >= config_.num_hidden_layers) {
      return absl::InvalidArgumentError(absl::StrCat("no layer ", l));
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<double> CpuExecutor::MeasureLayerTransferSeconds() {
  LayerWeights scratch;
  scratch = weights_->layers[0];  // allocates: not timed
  double best = 0;
  for (int i = 0; i < 5; ++i) {  // the fastest of five: a preempted copy is not the link
    const absl::Time t0 = absl::Now();
    scratch = weights_->layers[static_cast<size_t>((i + 1) % config_.num_hidden_layers)];
    const double s = absl::ToDoubleSeconds(absl::Now() - t0);
    best = i == 0 ? s : std::min(best, s);
  }
  return best;
}

LayerStreamingStats CpuExecutor::streaming_stats() const {
  LayerStreamingStats s = retired_;
  s.streamed_bytes = slot_bytes_.load(std::memory_order_relaxed);
  if (streamer_) s.stall_seconds += streamer_->stats().stall_seconds;
  return s;
}

absl::Status CpuExecutor::StartKvLoad(LayerKvCopies load) {
  if (load.layers.size() > static_cast<size_t>(config_.num_hidden_layers)) {
    return absl::InvalidArgumentError("KV load has more layers than the model");
  }
  if (!loader_) {
    loader_ = std::make_unique<LayerKvLoader>([this](absl::Span<const KvBlockCopy> copies) {
      // The default copy is memcpy and cannot fail.
      Executor::CopyKvFromHost(copies).IgnoreError();
    });
  }
  loader_->Start(std::move(load));
  return absl::OkStatus();
}

absl::Status CpuExecutor::WaitKvLoad() {
  if (loader_) loader_->WaitAll();
  return absl::OkStatus();
}

void CpuExecutor::AttentionBlock(int l, const LayerWeights& L,
                                 absl::Span<const SequenceChunk> batch, const std::vector<int>& pos,
                                 const std::vector<int>& owner, std::vector<float>* x) {
  const ModelConfig& c = config_;
  const int T = static_cast<int>(pos.size()), H = c.hidden_size, Q = c.q_dim(), KV = c.kv_dim();
  const int d = c.head_dim, group = c.num_attention_heads / c.num_key_value_heads;
  std::vector<float> h(x->size()), q(static_cast<size_t>(T) * Q), k(static_cast<size_t>(T) * KV),
      v(k.size()), attn(q.size()), proj(x->size()), scratch;
  for (int t = 0; t < T; ++t) {
    RmsNorm(x->data() + static_cast<size_t>(t) * H, L.input_norm, c.rms_norm_eps, H,
            &h[static_cast<size_t>(t) * H]);
  }
  // FP8 activations, one scale per token (not in one- or two-token steps)
  const bool fp8 = c.weight_quant == WeightQuant::kFp8 && T > kFp8UnroundedInputMaxTokens;
  if (fp8) RoundRowsToFp8(h.data(), T, H);
  Linear(L.q, &L.q_bias, h.data(), T, q.data());
  Linear(L.k, &L.k_bias, h.data(), T, k.data());
  Linear(L.v, &L.v_bias, h.data(), T, v.data());
  if (c.qk_norm) {  // Qwen3: per-head RMSNorm of q and k before RoPE
    HeadRmsNorm(q.data(), T * c.num_attention_heads, d, L.q_norm, c.rms_norm_eps);
    HeadRmsNorm(k.data(), T * c.num_key_value_heads, d, L.k_norm, c.rms_norm_eps);
  }
  for (int t = 0; t < T; ++t) {
    ApplyRope(&q[static_cast<size_t>(t) * Q], c.num_attention_heads, pos[t]);
    ApplyRope(&k[static_cast<size_t>(t) * KV], c.num_key_value_heads, pos[t]);
    kv_->Write(*batch[owner[t]].kv, l, pos[t], &k[static_cast<size_t>(t) * KV],
               &v[static_cast<size_t>(t) * KV]);
  }
  // Causal attention: token at position p attends to positions [0, p].
  for (int t = 0; t < T; ++t) {
    for (int head = 0; head < c.num_attention_heads; ++head) {
      const size_t off = static_cast<size_t>(t) * Q + static_cast<size_t>(head) * d;
      AttendHead(*kv_, *batch[owner[t]].kv, l, head / group, pos[t] + 1, d, &q[off], &attn[off],
                 &scratch);
    }
  }
  if (fp8) RoundRowsToFp8(attn.data(), T, Q);
  Linear(L.o, &L.o_bias, attn.data(), T, proj.data());
  for (size_t i = 0; i < x->size(); ++i) (*x)[i] += proj[i];
}

void CpuExecutor::MlpBlock(const LayerWeights& L, int T, std::vector<float>* x) {
  const ModelConfig& c = config_;
  const int H = c.hidden_size, I = c.intermediate_size;
  std::vector<float> h(x->size()), gate(static_cast<size_t>(T) * I), up(gate.size()),
      proj(x->size());
  for (int t = 0; t < T; ++t) {
    RmsNorm(x->data() + static_cast<size_t>(t) * H, L.post_norm, c.rms_norm_eps, H,
            &h[static_cast<size_t>(t) * H]);
  }
  // FP8 activations, one scale per token (not in one- or two-token steps)
  const bool fp8 = c.weight_quant == WeightQuant::kFp8 && T > kFp8UnroundedInputMaxTokens;
  if (fp8) RoundRowsToFp8(h.data(), T, H);
  Linear(L.gate, nullptr, h.data(), T, gate.data());
  Linear(L.up, nullptr, h.data(), T, up.data());
  for (size_t i = 0; i < gate.size(); ++i) {
    const float g = gate[i];
    gate[i] = g / (1.0f + std::exp(-g)) * up[i];  // SiLU(gate) * up
  }
  if (fp8) RoundRowsToFp8(gate.data(), T, I);
  Linear(L.down, nullptr, gate.data(), T, proj.data());
  for (size_t i = 0; i < x->size(); ++i) (*x)[i] += proj[i];
}

void CpuExecutor::ComputeLogits(absl::Span<const SequenceChunk> batch, const std::vector<float>& x,
                                std::vector<float>* logits) const {
  // Final norm + LM head for the requested rows only.
  const ModelConfig& c = config_;
  const ModelWeights& w = *weights_;
  const int H = c.hidden_size;
  const Matrix& head = w.output_matrix();
  logits->clear();
  std::vector<float> normed(H);
  int t0 = 0;
  for (const SequenceChunk& ch : batch) {
    const int n = static_cast<int>(ch.tokens.size());
    int first = t0 + n, last = t0 + n;
    if (ch.logits == LogitsMode::kLast && n > 0) first = t0 + n - 1;
    if (ch.logits == LogitsMode::kAll) first = t0;
    for (int t = first; t < last; ++t) {
      RmsNorm(&x[static_cast<size_t>(t) * H], w.final_norm, c.rms_norm_eps, H, normed.data());
      const size_t base = logits->size();
      logits->resize(base + c.vocab_size);
      Linear(head, nullptr, normed.data(), 1, logits->data() + base);
    }
    t0 += n;
  }
}

}  // namespace ballast::engine
