#include "engine/synthetic_model.h"

#include <cmath>
#include <filesystem>
#include <fstream>
#include <memory>
#include <random>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "engine/safetensors.h"
#include "engine/tokenizer.h"
#include "transfer/latch.h"
#include "transfer/worker_pool.h"

namespace ballast::engine {
namespace {

// Deterministic normal samples (Box-Muller over mt19937_64, which the
// standard fixes bit for bit, unlike std::normal_distribution). Each sample
// takes two draws of the engine.
class Gaussian {
 public:
  explicit Gaussian(uint64_t seed) : rng_(seed) {}
  double Next() {
    const double u1 = (static_cast<double>(rng_() >> 11) + 1.0) * 0x1.0p-53;
    const double u2 = static_cast<double>(rng_() >> 11) * 0x1.0p-53;
    return std::sqrt(-2.0 * std::log(u1)) * std::cos(2.0 * M_PI * u2);
  }
  // Moves past `samples` samples without computing them (two draws each:
  // a tenth of Next()'s cost).
  void Skip(int64_t samples) { rng_.discard(2 * static_cast<unsigned long long>(samples)); }

 private:
  std::mt19937_64 rng_;
};

// Fills tensors from one sample stream, in order, with the bytes a
// sequential pass would write: this thread walks the stream (Skip, cheap)
// and hands each chunk, with a copy of the engine at its start, to a worker
// that does the costly part (Box-Muller and the dtype conversion).
class TensorFiller {
 public:
  // `threads` <= 1: everything on the calling thread.
  TensorFiller(uint64_t seed, int threads, int64_t chunk)
      : g_(seed), chunk_(std::max<int64_t>(1, chunk)) {
    if (threads > 1) pool_ = std::make_unique<transfer::WorkerPool>(threads, 0, "model-fill");
  }

  OwnedTensor Make(const std::string& name, std::vector<int64_t> shape, DType dt, double mean,
                   double std) {
    int64_t n = 1;
    for (int64_t d : shape) n *= d;
    OwnedTensor t;
    t.name = name;
    t.dtype = dt;
    t.shape = std::move(shape);
    t.bytes.resize(static_cast<size_t>(n) * DTypeSize(dt));
    uint8_t* out = t.bytes.data();
    if (pool_ == nullptr) {
      Fill(g_, out, 0, n, dt, mean, std);
      return t;
    }
    // transfer::Latch, not absl::BlockingCounter: ThreadSanitizer sees it
    // order the fills before the return.
    std::shared_ptr<transfer::Latch> left = transfer::Latch::Create((n + chunk_ - 1) / chunk_);
    for (int64_t begin = 0; begin < n; begin += chunk_) {
      const int64_t len = std::min(chunk_, n - begin);
      pool_->Schedule([g = g_, out, begin, len, dt, mean, std, left]() mutable {
        Fill(g, out, begin, len, dt, mean, std);
        left->CountDown();
      });
      g_.Skip(len);
    }
    left->Wait();
    return t;
  }

 private:
  static void Fill(Gaussian& g, uint8_t* out, int64_t begin, int64_t len, DType dt, double mean,
                   double std) {
    std::vector<float> v(static_cast<size_t>(len));
    for (float& x : v) x = static_cast<float>(mean + std * g.Next());
    FromFloat(dt, v.data(), out + static_cast<size_t>(begin) * DTypeSize(dt), v.size());
  }

  Gaussian g_;
  const int64_t chunk_;                         // samples per work item
  std::unique_ptr<transfer::WorkerPool> pool_;  // null: single-threaded
};

}  // namespace

absl::StatusOr<ModelConfig> SyntheticConfig(const SyntheticModelSpec& s) {
  ModelConfig c;
  if (s.architecture == "llama") {
    c.architecture = "LlamaForCausalLM";
    c.model_type = "llama";
  } else if (s.architecture == "qwen2") {
    c.architecture = "Qwen2ForCausalLM";
    c.model_type = "qwen2";
  } else if (s.architecture == "mistral") {
    c.architecture = "MistralForCausalLM";
    c.model_type = "mistral";
  } else if (s.architecture == "qwen3") {
    c.architecture = "Qwen3ForCausalLM";
    c.model_type = "qwen3";
  } else {
    return absl::InvalidArgumentError(absl::StrCat("architecture \"", s.architecture,
                                                   "\": expected llama, qwen2, mistral or qwen3"));
  }
  if (s.layers <= 0 || s.hidden <= 0 || s.heads <= 0 || s.kv_heads <= 0 || s.intermediate <= 0 ||
      s.head_dim < 0) {
    return absl::InvalidArgumentError(
        "layers, hidden, heads, kv-heads, intermediate must be > 0 (head-dim >= 0)");
  }
  if (s.head_dim == 0 && (s.hidden % s.heads != 0 || (s.hidden / s.heads) % 2 != 0)) {
    return absl::InvalidArgumentError("hidden / heads must be an even integer (the head size)");
  }
  if (s.head_dim % 2 != 0) return absl::InvalidArgumentError("head-dim must be even (RoPE)");
  if (s.heads % s.kv_heads != 0) return absl::InvalidArgumentError("kv-heads must divide heads");
  if (s.vocab < ByteTokenizer::kMinVocab) {
    return absl::InvalidArgumentError(
        absl::StrCat("vocab must be >= ", ByteTokenizer::kMinVocab, " (byte tokenizer)"));
  }
  auto dt = DTypeFromConfig(s.dtype);
  if (!dt.ok()) return dt.status();
  c.hidden_size = s.hidden;
  c.intermediate_size = s.intermediate;
  c.num_hidden_layers = s.layers;
  c.num_attention_heads = s.heads;
  c.num_key_value_heads = s.kv_heads;
  c.head_dim = s.head_dim > 0 ? s.head_dim : s.hidden / s.heads;
  c.vocab_size = s.vocab;
  c.max_position_embeddings = s.max_position;
  c.rms_norm_eps = 1e-5;
  c.rope_theta = s.rope_theta;
  c.tie_word_embeddings = s.tie_embeddings;
  c.qkv_bias = s.architecture == "qwen2";
  c.qk_norm = s.architecture == "qwen3";
  c.torch_dtype = *dt;
  c.bos_token_id = ByteTokenizer::kBos;
  c.eos_token_id = ByteTokenizer::kEos;
  if (s.llama3_rope_scaling) {
    RopeScaling r;
    r.type = "llama3";
    r.factor = 8.0;
    r.low_freq_factor = 1.0;
    r.high_freq_factor = 4.0;
    r.original_max_position_embeddings = std::max(16, s.max_position / 8);
    c.rope_scaling = r;
  }
  return c;
}

absl::Status WriteSyntheticModel(const SyntheticModelSpec& s, const std::string& dir,
                                 const SyntheticWriteOptions& options) {
  auto cfg = SyntheticConfig(s);
  if (!cfg.ok()) return cfg.status();
  const ModelConfig& c = *cfg;
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec)
    return absl::PermissionDeniedError(absl::StrCat("cannot create ", dir, ": ", ec.message()));
  const int threads =
      options.threads > 0 ? options.threads : static_cast<int>(std::thread::hardware_concurrency());
  TensorFiller g(s.seed, threads, options.chunk_samples);
  const DType dt = c.torch_dtype;
  const int64_t h = c.hidden_size;
  const double sd = s.init_std;
  std::vector<OwnedTensor> ts;
  ts.push_back(g.Make("model.embed_tokens.weight", {c.vocab_size, h}, dt, 0, 1.0));
  for (int l = 0; l < c.num_hidden_layers; ++l) {
    const std::string p = absl::StrCat("model.layers.", l, ".");
    ts.push_back(g.Make(p + "input_layernorm.weight", {h}, dt, 1.0, 0.1));
    ts.push_back(g.Make(p + "self_attn.q_proj.weight", {c.q_dim(), h}, dt, 0, sd * 4));
    ts.push_back(g.Make(p + "self_attn.k_proj.weight", {c.kv_dim(), h}, dt, 0, sd * 4));
    ts.push_back(g.Make(p + "self_attn.v_proj.weight", {c.kv_dim(), h}, dt, 0, sd * 4));
    if (c.qkv_bias) {
      ts.push_back(g.Make(p + "self_attn.q_proj.bias", {c.q_dim()}, dt, 0, 0.1));
      ts.push_back(g.Make(p + "self_attn.k_proj.bias", {c.kv_dim()}, dt, 0, 0.1));
      ts.push_back(g.Make(p + "self_attn.v_proj.bias", {c.kv_dim()}, dt, 0, 0.1));
    }
    ts.push_back(g.Make(p + "self_attn.o_proj.weight", {h, c.q_dim()}, dt, 0, sd));
    if (c.qk_norm) {
      ts.push_back(g.Make(p + "self_attn.q_norm.weight", {c.head_dim}, dt, 1.0, 0.1));
      ts.push_back(g.Make(p + "self_attn.k_norm.weight", {c.head_dim}, dt, 1.0, 0.1));
    }
    ts.push_back(g.Make(p + "post_attention_layernorm.weight", {h}, dt, 1.0, 0.1));
    ts.push_back(g.Make(p + "mlp.gate_proj.weight", {c.intermediate_size, h}, dt, 0, sd));
    ts.push_back(g.Make(p + "mlp.up_proj.weight", {c.intermediate_size, h}, dt, 0, sd));
    ts.push_back(g.Make(p + "mlp.down_proj.weight", {h, c.intermediate_size}, dt, 0, sd));
  }
  ts.push_back(g.Make("model.norm.weight", {h}, dt, 1.0, 0.1));
  if (!c.tie_word_embeddings) {
    OwnedTensor head = g.Make("lm_head.weight", {c.vocab_size, h}, dt, 0, sd * 4);
    if (s.printable_prior) {
      // Shrink the rows of tokens other than printable ASCII, space and EOS
      // so random models mostly emit readable characters.
      std::vector<float> row(static_cast<size_t>(h));
      for (int id = 0; id < c.vocab_size; ++id) {
        if ((id >= 32 && id < 127) || id == ByteTokenizer::kEos) continue;
        uint8_t* p = head.bytes.data() + static_cast<size_t>(id) * h * DTypeSize(dt);
        ToFloat(dt, p, row.data(), row.size());
        for (float& x : row) x *= 0.25f;
        FromFloat(dt, row.data(), p, row.size());
      }
    }
    ts.push_back(std::move(head));
  }
  const std::filesystem::path d(dir);
  if (auto st = WriteSafetensors((d / "model.safetensors").string(), ts, {{"format", "pt"}});
      !st.ok()) {
    return st;
  }
  std::ofstream cj(d / "config.json", std::ios::trunc);
  cj << c.ToJson();
  cj.close();
  if (!cj) return absl::DataLossError(absl::StrCat("cannot write ", (d / "config.json").string()));
  return absl::OkStatus();
}

}  // namespace ballast::engine
