#include "engine/model_config.h"

#include <fstream>
#include <sstream>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "nlohmann/json.hpp"

namespace ballast::engine {
namespace {

using nlohmann::json;

absl::Status KeyError(const std::string& origin, const std::string& key, const std::string& what) {
  return absl::InvalidArgumentError(absl::StrCat(origin, ": key \"", key, "\": ", what));
}

template <typename T>
absl::Status Read(const json& j, const std::string& origin, const char* key, T* out,
                  bool required) {
  auto it = j.find(key);
  if (it == j.end() || it->is_null()) {
    if (required) return KeyError(origin, key, "missing");
    return absl::OkStatus();
  }
  try {
    *out = it->get<T>();
  } catch (const json::exception& e) {
    return KeyError(origin, key, absl::StrCat("wrong type (", e.what(), ")"));
  }
  return absl::OkStatus();
}

// config.json's quantization_config: FP8 forms with per-tensor or
// per-channel weight scales are accepted; anything else is refused.
absl::Status ParseQuantizationConfig(const json& q, const std::string& origin, ModelConfig* c) {
  const std::string key = "quantization_config";
  if (!q.is_object()) return KeyError(origin, key, "expected an object");
  const std::string method = q.value("quant_method", std::string());
  if (method == "fp8") {
    if (q.contains("weight_block_size") && !q["weight_block_size"].is_null()) {
      return KeyError(origin, key + ".weight_block_size",
                      "block-wise FP8 scales are not supported (per-tensor or per-channel only)");
    }
    c->fp8_checkpoint = true;
    return absl::OkStatus();
  }
  if (method == "compressed-tensors") {
    const auto groups = q.find("config_groups");
    if (groups == q.end() || !groups->is_object() || groups->empty()) {
      return KeyError(origin, key + ".config_groups", "expected at least one group");
    }
    for (const auto& [name, g] : groups->items()) {
      const json w = g.is_object() && g.contains("weights") ? g["weights"] : json();
      const bool fp8 = w.is_object() && w.value("type", std::string()) == "float" &&
                       w.value("num_bits", 0) == 8 &&
                       (w.value("strategy", std::string()) == "tensor" ||
                        w.value("strategy", std::string()) == "channel");
      if (!fp8) {
        return KeyError(origin, absl::StrCat(key, ".config_groups.", name, ".weights"),
                        "only 8-bit float weights with tensor or channel strategy are supported");
      }
    }
    c->fp8_checkpoint = true;
    return absl::OkStatus();
  }
  return KeyError(origin, key + ".quant_method",
                  absl::StrCat("\"", method, "\" is not supported (fp8, compressed-tensors FP8)"));
}

// The first error of a series of checks (the later ones still run).
struct FirstError {
  absl::Status s;
  void operator()(absl::Status st) {
    if (s.ok()) s = std::move(st);
  }
};

// "architectures": one of the supported decoders (Qwen3 also sets its
// head_dim default).
absl::Status ParseArchitecture(const json& j, const std::string& origin, ModelConfig* c) {
  if (auto it = j.find("architectures"); it != j.end() && it->is_array() && !it->empty()) {
    c->architecture = (*it)[0].get<std::string>();
  }
  if (c->architecture != "LlamaForCausalLM" && c->architecture != "MistralForCausalLM" &&
      c->architecture != "Qwen2ForCausalLM" && c->architecture != "Qwen3ForCausalLM") {
    return KeyError(origin, "architectures",
                    absl::StrCat("unsupported architecture ", c->architecture,
                                 " (supported: LlamaForCausalLM, MistralForCausalLM, "
                                 "Qwen2ForCausalLM, Qwen3ForCausalLM)"));
  }
  if (c->architecture == "Qwen3ForCausalLM")
    c->head_dim = 128;  // Qwen3Config's default (not hidden / heads)
  return absl::OkStatus();
}

// The shape keys (sizes, layers, heads, vocabulary, norms, RoPE base) and
// the special token ids.
absl::Status ReadShape(const json& j, const std::string& origin, ModelConfig* c) {
  FirstError chain;
  chain(Read(j, origin, "model_type", &c->model_type, false));
  chain(Read(j, origin, "hidden_size", &c->hidden_size, true));
  chain(Read(j, origin, "intermediate_size", &c->intermediate_size, true));
  chain(Read(j, origin, "num_hidden_layers", &c->num_hidden_layers, true));
  chain(Read(j, origin, "num_attention_heads", &c->num_attention_heads, true));
  c->num_key_value_heads = c->num_attention_heads;
  chain(Read(j, origin, "num_key_value_heads", &c->num_key_value_heads, false));
  chain(Read(j, origin, "head_dim", &c->head_dim, false));
  chain(Read(j, origin, "vocab_size", &c->vocab_size, true));
  chain(Read(j, origin, "max_position_embeddings", &c->max_position_embeddings, false));
  chain(Read(j, origin, "rms_norm_eps", &c->rms_norm_eps, false));
  chain(Read(j, origin, "rope_theta", &c->rope_theta, false));
  chain(Read(j, origin, "tie_word_embeddings", &c->tie_word_embeddings, false));
  chain(Read(j, origin, "bos_token_id", &c->bos_token_id, false));
  // eos_token_id is an int or (Llama 3.1 and later) a list; the first is
  // kept here, and the tokenizer collects every EOS id (tokenizer.h).
  if (auto it = j.find("eos_token_id"); it != j.end() && it->is_array()) {
    if (it->empty() || !(*it)[0].is_number_integer()) {
      chain(KeyError(origin, "eos_token_id", "expected an integer or a non-empty integer list"));
    } else {
      c->eos_token_id = (*it)[0].get<int>();
    }
  } else {
    chain(Read(j, origin, "eos_token_id", &c->eos_token_id, false));
  }
  return chain.s;
}

// RoPE scaling (llama3 only) from rope_scaling or rope_parameters.
absl::Status ParseRope(const json& j, const std::string& origin, ModelConfig* c) {
  // transformers >= 5 may nest rope_theta/rope_scaling under rope_parameters.
  const json* rope = nullptr;
  if (auto it = j.find("rope_scaling"); it != j.end() && !it->is_null()) rope = &*it;
  if (auto it = j.find("rope_parameters"); it != j.end() && it->is_object()) {
    if (auto th = it->find("rope_theta"); th != it->end()) c->rope_theta = th->get<double>();
    if (auto t = it->find("rope_type"); t != it->end() && t->get<std::string>() != "default")
      rope = &*it;
  }
  if (rope == nullptr) return absl::OkStatus();
  RopeScaling r;
  std::string type;
  if (auto t = rope->find("rope_type"); t != rope->end())
    type = t->get<std::string>();
  else if (auto t2 = rope->find("type"); t2 != rope->end())
    type = t2->get<std::string>();
  if (type != "llama3") {
    return KeyError(origin, "rope_scaling",
                    absl::StrCat("unsupported rope type \"", type, "\" (supported: llama3)"));
  }
  r.type = type;
  FirstError chain;
  chain(Read(*rope, origin, "factor", &r.factor, true));
  chain(Read(*rope, origin, "low_freq_factor", &r.low_freq_factor, true));
  chain(Read(*rope, origin, "high_freq_factor", &r.high_freq_factor, true));
  chain(Read(*rope, origin, "original_max_position_embeddings", &r.original_max_position_embeddings,
             true));
  if (!chain.s.ok()) return chain.s;
  c->rope_scaling = r;
  return absl::OkStatus();
}

// quantization_config, if present: an FP8 checkpoint (ParseQuantizationConfig).
absl::Status ParseQuantization(const json& j, const std::string& origin, ModelConfig* c) {
  if (auto it = j.find("quantization_config"); it != j.end() && !it->is_null()) {
    absl::Status st;
    try {
      st = ParseQuantizationConfig(*it, origin, c);
    } catch (const json::exception& e) {
      st = KeyError(origin, "quantization_config", absl::StrCat("wrong type (", e.what(), ")"));
    }
    if (!st.ok()) return st;
    c->weight_quant = WeightQuant::kFp8;
  }
  return absl::OkStatus();
}

// Biases, activation and dtype: what the forward pass supports.
absl::Status ParseFeatures(const json& j, const std::string& origin, ModelConfig* c) {
  FirstError chain;
  bool attention_bias = false;
  chain(Read(j, origin, "attention_bias", &attention_bias, false));
  bool mlp_bias = false;
  chain(Read(j, origin, "mlp_bias", &mlp_bias, false));
  std::string act = "silu";
  chain(Read(j, origin, "hidden_act", &act, false));
  std::string dtype = "bfloat16";
  if (j.contains("dtype"))
    chain(Read(j, origin, "dtype", &dtype, false));
  else
    chain(Read(j, origin, "torch_dtype", &dtype, false));
  if (!chain.s.ok()) return chain.s;
  if (mlp_bias) return KeyError(origin, "mlp_bias", "true is not supported");
  if (act != "silu") return KeyError(origin, "hidden_act", "only silu is supported");
  auto dt = DTypeFromConfig(dtype);
  if (!dt.ok()) return KeyError(origin, "torch_dtype", std::string(dt.status().message()));
  c->torch_dtype = *dt;
  if (c->architecture == "Qwen2ForCausalLM") {
    c->qkv_bias = true;
  } else {
    c->qkv_bias = attention_bias;
    c->o_bias = attention_bias;
  }
  c->qk_norm = c->architecture == "Qwen3ForCausalLM";
  return absl::OkStatus();
}

// Checks the shape's sizes, caps the context at a sliding window and
// derives head_dim where it is not given.
absl::Status CheckShape(const json& j, const std::string& origin, ModelConfig* c) {
  FirstError chain;
  auto positive = [&](const char* key, int v) -> absl::Status {
    return v > 0 ? absl::OkStatus() : KeyError(origin, key, "must be > 0");
  };
  chain(positive("hidden_size", c->hidden_size));
  chain(positive("intermediate_size", c->intermediate_size));
  chain(positive("num_hidden_layers", c->num_hidden_layers));
  chain(positive("num_attention_heads", c->num_attention_heads));
  chain(positive("num_key_value_heads", c->num_key_value_heads));
  chain(positive("vocab_size", c->vocab_size));
  chain(positive("max_position_embeddings", c->max_position_embeddings));
  if (!chain.s.ok()) return chain.s;
  // Sliding-window attention is not implemented: contexts are capped at the
  // window, where full attention and sliding-window attention agree.
  if (auto it = j.find("sliding_window"); it != j.end() && it->is_number_integer()) {
    bool use = c->architecture == "MistralForCausalLM";
    if (auto u = j.find("use_sliding_window"); u != j.end() && u->is_boolean())
      use = u->get<bool>();
    const int window = it->get<int>();
    if (use && window > 0 && window < c->max_position_embeddings)
      c->max_position_embeddings = window;
  }
  if (c->head_dim < 0) return KeyError(origin, "head_dim", "must be > 0");
  if (c->head_dim == 0) {
    if (c->hidden_size % c->num_attention_heads != 0)
      return KeyError(origin, "num_attention_heads", "does not divide hidden_size");
    c->head_dim = c->hidden_size / c->num_attention_heads;
  }
  if (c->head_dim % 2 != 0) return KeyError(origin, "head_dim", "must be even (RoPE)");
  if (c->num_attention_heads % c->num_key_value_heads != 0)
    return KeyError(origin, "num_key_value_heads", "must divide num_attention_heads");
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<WeightQuant> WeightQuantFromConfig(std::string_view name) {
  if (name.empty() || name == "none") return WeightQuant::kNone;
  if (name == "fp8" || name == "fp8_e4m3") return WeightQuant::kFp8;
  return absl::InvalidArgumentError(
      absl::StrCat("quantization \"", std::string(name), "\" is unknown (expected none or fp8)"));
}

const char* WeightQuantName(WeightQuant q) { return q == WeightQuant::kFp8 ? "fp8" : "none"; }

absl::Status ApplyServingQuant(std::string_view option, ModelConfig* c) {
  auto quant = WeightQuantFromConfig(option);
  if (!quant.ok()) return quant.status();
  if (!c->fp8_checkpoint) c->weight_quant = *quant;
  return absl::OkStatus();
}

absl::StatusOr<ModelConfig> ModelConfig::Load(const std::string& path) {
  std::ifstream in(path);
  if (!in) return absl::NotFoundError(absl::StrCat("cannot open ", path));
  std::stringstream ss;
  ss << in.rdbuf();
  return Parse(ss.str(), path);
}

absl::StatusOr<ModelConfig> ModelConfig::Parse(const std::string& text, const std::string& origin) {
  json j;
  try {
    j = json::parse(text);
  } catch (const json::exception& e) {
    return absl::InvalidArgumentError(absl::StrCat(origin, ": invalid JSON: ", e.what()));
  }
  if (!j.is_object()) return absl::InvalidArgumentError(absl::StrCat(origin, ": not an object"));
  ModelConfig c;
  // The phases in turn; the first error ends the parse.
  for (auto* phase :
       {ParseArchitecture, ReadShape, ParseRope, ParseQuantization, ParseFeatures, CheckShape}) {
    if (absl::Status st = phase(j, origin, &c); !st.ok()) return st;
  }
  return c;
}

std::string ModelConfig::ToJson() const {
  json j;
  j["architectures"] = {architecture};
  j["model_type"] = model_type;
  j["hidden_size"] = hidden_size;
  j["intermediate_size"] = intermediate_size;
  j["num_hidden_layers"] = num_hidden_layers;
  j["num_attention_heads"] = num_attention_heads;
  j["num_key_value_heads"] = num_key_value_heads;
  j["head_dim"] = head_dim;
  j["vocab_size"] = vocab_size;
  j["max_position_embeddings"] = max_position_embeddings;
  j["rms_norm_eps"] = rms_norm_eps;
  j["rope_theta"] = rope_theta;
  j["tie_word_embeddings"] = tie_word_embeddings;
  j["hidden_act"] = "silu";
  j["torch_dtype"] = torch_dtype == DType::kF32   ? "float32"
                     : torch_dtype == DType::kF16 ? "float16"
                                                  : "bfloat16";
  j["bos_token_id"] = bos_token_id;
  j["eos_token_id"] = eos_token_id;
  if (model_type == "llama") {
    j["attention_bias"] = qkv_bias;
    j["mlp_bias"] = false;
  }
  if (model_type == "qwen3") {
    j["attention_bias"] = qkv_bias;
    j["use_sliding_window"] = false;
  }
  if (rope_scaling) {
    j["rope_scaling"] = {
        {"rope_type", rope_scaling->type},
        {"factor", rope_scaling->factor},
        {"low_freq_factor", rope_scaling->low_freq_factor},
        {"high_freq_factor", rope_scaling->high_freq_factor},
        {"original_max_position_embeddings", rope_scaling->original_max_position_embeddings}};
  }
  return j.dump(2) + "\n";
}

int64_t ModelConfig::NumParameters() const {
  const int64_t h = hidden_size;
  int64_t per_layer = 2 * h                             // norms
                      + h * q_dim() + 2 * h * kv_dim()  // q, k, v
                      + q_dim() * h                     // o
                      + 3 * h * intermediate_size;      // gate, up, down
  if (qkv_bias) per_layer += q_dim() + 2 * kv_dim();
  if (o_bias) per_layer += h;
  if (qk_norm) per_layer += 2 * head_dim;
  int64_t total = per_layer * num_hidden_layers + h + vocab_size * h;
  if (!tie_word_embeddings) total += vocab_size * h;
  return total;
}

}  // namespace ballast::engine
