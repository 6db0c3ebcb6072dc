#include "sim/engine_model.h"

#include <algorithm>
#include <cmath>
#include <fstream>
#include <map>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "engine/attention_plan.h"
#include "engine/graph_buckets.h"
#include "nlohmann/json.hpp"

namespace ballast::sim {

double ModelShape::layer_params() const {
  const double q = static_cast<double>(heads) * head_dim;
  const double kv = static_cast<double>(kv_heads) * head_dim;
  const double per_layer = hidden * q + 2.0 * hidden * kv + q * hidden +
                           3.0 * hidden * static_cast<double>(intermediate);
  return layers * per_layer;
}

double ModelShape::lm_head_params() const { return static_cast<double>(vocab) * hidden; }

double ModelShape::dense_params() const { return layer_params() + lm_head_params(); }

double ModelShape::weight_bytes_read() const { return dense_params() * weight_dtype_bytes; }

int64_t ModelShape::weight_bytes() const {
  double params = dense_params() + (2.0 * layers + 1) * hidden;  // norms
  if (!tied_embeddings) params += static_cast<double>(vocab) * hidden;
  return static_cast<int64_t>(params * weight_dtype_bytes);
}

int64_t ModelShape::kv_bytes_per_token() const {
  return 2LL * layers * kv_heads * head_dim * kv_dtype_bytes;
}

ModelShape TensorParallelPart(const ModelShape& shape, int tp) {
  if (tp <= 1) return shape;
  ModelShape part = shape;
  part.heads = shape.heads / tp;
  part.kv_heads = std::max(1, shape.kv_heads / tp);
  part.intermediate = (shape.intermediate + tp - 1) / tp;
  part.vocab = (shape.vocab + tp - 1) / tp;
  return part;
}

int64_t EngineWorkspaceBytes(const ModelShape& s, int max_batch_tokens, int max_seqs,
                             const WorkspaceContext& ctx) {
  const int64_t t = max_batch_tokens, a = 2;  // BF16 activations
  const int64_t rows = std::min<int64_t>(engine::GraphBucketTokens(std::max(max_seqs, 1)), t);
  const int64_t h = s.hidden, q = static_cast<int64_t>(s.heads) * s.head_dim,
                kv = static_cast<int64_t>(s.kv_heads) * s.head_dim, i = s.intermediate;
  const int64_t activations = t * h * 4                       // residual stream (FP32)
                              + t * (2 * h + q + 2 * kv) * a  // x, projections, qkv
                              + 2 * t * q * a                 // queries, attention output
                              + 3 * t * i * a;                // gate/up, MLP activations
  const int64_t logits = rows * h * a + rows * static_cast<int64_t>(s.vocab) * 4;
  int64_t context = 0;
  if (ctx.max_context > 0) {
    // The attention workspace at kAttentionBlocksPerSm resident blocks an
    // SM: the node's kernel keeps its own figure (engine/attention_plan.h),
    // 3 at head size 128 on sm_90 (llama-8b: about 4 MiB less than this)
    // and 5 at 64 (llama-1b: about 2 MiB more).
    context = static_cast<int64_t>(engine::MaxPagedAttentionWorkspaceBytes(
                  static_cast<int>(t), s.heads, s.kv_heads, s.head_dim, ctx.max_context,
                  ctx.num_sms, engine::kAttentionBlocksPerSm)) +
              static_cast<int64_t>(s.layers) * rows *
                  ((ctx.max_context + ctx.block_tokens - 1) / std::max(ctx.block_tokens, 1)) * 4;
  }
  return activations + logits + (32LL << 20) + 2 * (16LL << 20) + context;
}

absl::StatusOr<ModelShape> NamedShape(const std::string& name) {
  // {layers, hidden, heads, kv_heads, head_dim, intermediate, vocab, tied}
  static const std::map<std::string, ModelShape> kShapes = {
      {"llama-1b", {16, 2048, 32, 8, 64, 8192, 128256, true}},
      {"llama-3b", {28, 3072, 24, 8, 128, 8192, 128256, true}},
      {"llama-8b", {32, 4096, 32, 8, 128, 14336, 128256, false}},
      {"qwen-14b", {48, 5120, 40, 8, 128, 13824, 152064, false}},
      {"qwen-32b", {64, 5120, 40, 8, 128, 27648, 152064, false}},
      {"llama-70b", {80, 8192, 64, 8, 128, 28672, 128256, false}},
  };
  auto it = kShapes.find(name);
  if (it == kShapes.end()) {
    return absl::InvalidArgumentError(
        absl::StrCat("unknown model shape \"", name,
                     "\" (known: llama-1b, llama-3b, llama-8b, qwen-14b, qwen-32b, llama-70b)"));
  }
  return it->second;
}

double PrefillAttentionPairs(int tokens, int before) {
  return static_cast<double>(tokens) * (before + (tokens + 1) / 2.0);
}

std::array<double, kFeatures> StepFeatures(const ModelShape& s, const StepWork& w,
                                           double ridge_tokens) {
  const double layers2 = 2.0 * s.layer_params(), head2 = 2.0 * s.lm_head_params();
  // A decode-only step replays a CUDA graph of its bucket's rows
  // (engine/graph_buckets.h): the padded rows' GEMM FLOPs count too, the
  // head's among them. Otherwise the layers multiply every token and the
  // head the sampled rows.
  const bool graph = w.prefill_tokens == 0 && w.decode_tokens > 0;
  const int gemm_tokens =
      graph ? engine::GraphBucketTokens(w.decode_tokens) : w.decode_tokens + w.prefill_tokens;
  const int head_rows = graph ? gemm_tokens : w.decode_tokens + w.prefill_logits;
  const double past_ridge = layers2 * std::max(0.0, gemm_tokens - ridge_tokens) +
                            head2 * std::max(0.0, head_rows - ridge_tokens);
  return {1.0,
          static_cast<double>(s.layers),
          s.weight_bytes_read(),
          w.decode_context * static_cast<double>(s.kv_bytes_per_token()),
          static_cast<double>(w.decode_tokens) * s.layers,
          (layers2 + head2) * w.decode_tokens,
          layers2 * w.prefill_tokens + head2 * w.prefill_logits,
          4.0 * s.layers * s.heads * s.head_dim * w.prefill_attention,
          s.kv_dtype_bytes == 1 ? w.decode_context * 2.0 * s.layers * s.kv_heads * s.head_dim : 0.0,
          past_ridge,
          graph ? 0.0 : static_cast<double>(s.layers)};
}

namespace {

absl::Status FieldError(const std::string& origin, const std::string& field,
                        const std::string& what) {
  return absl::InvalidArgumentError(absl::StrCat(origin, ": ", field, ": ", what));
}

absl::StatusOr<ModelShape> ParseShape(const nlohmann::json& j, const std::string& where) {
  ModelShape s;
  const std::pair<const char*, int*> ints[] = {{"layers", &s.layers},
                                               {"hidden", &s.hidden},
                                               {"heads", &s.heads},
                                               {"kv_heads", &s.kv_heads},
                                               {"head_dim", &s.head_dim},
                                               {"intermediate", &s.intermediate},
                                               {"vocab", &s.vocab},
                                               {"weight_dtype_bytes", &s.weight_dtype_bytes},
                                               {"kv_dtype_bytes", &s.kv_dtype_bytes}};
  for (const auto& [key, out] : ints) {
    if (!j.contains(key)) continue;
    if (!j[key].is_number_integer() || j[key].get<int>() <= 0) {
      return absl::InvalidArgumentError(absl::StrCat(where, ".", key, ": a positive integer"));
    }
    *out = j[key].get<int>();
  }
  if (j.contains("tied_embeddings")) s.tied_embeddings = j["tied_embeddings"].get<bool>();
  if (s.head_dim == 0 && s.heads > 0) s.head_dim = s.hidden / s.heads;
  if (s.layers <= 0 || s.hidden <= 0 || s.heads <= 0 || s.kv_heads <= 0 || s.intermediate <= 0 ||
      s.vocab <= 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        where, ": needs layers, hidden, heads, kv_heads, intermediate and vocab (> 0)"));
  }
  return s;
}

absl::StatusOr<double> Number(const nlohmann::json& j, const char* key, const std::string& where,
                              bool required = true) {
  if (!j.contains(key)) {
    if (required) return absl::InvalidArgumentError(absl::StrCat(where, ": missing \"", key, "\""));
    return 0.0;
  }
  if (!j[key].is_number() || j[key].get<double>() < 0) {
    return absl::InvalidArgumentError(absl::StrCat(where, ".", key, ": a number >= 0"));
  }
  return j[key].get<double>();
}

// A point's "shape": the name of one of `shapes`, into *name and *shape.
absl::Status LookUpShape(const nlohmann::json& p, const std::string& where,
                         const std::map<std::string, ModelShape>& shapes, std::string* name,
                         ModelShape* shape) {
  if (!p.contains("shape") || !p["shape"].is_string() || !shapes.count(p["shape"])) {
    return absl::InvalidArgumentError(absl::StrCat(where, ".shape: one of the \"shapes\""));
  }
  *name = p["shape"].get<std::string>();
  *shape = shapes.at(*name);
  return absl::OkStatus();
}

absl::StatusOr<CalibrationPoint> ParsePoint(const nlohmann::json& p, const std::string& where,
                                            const std::map<std::string, ModelShape>& shapes) {
  CalibrationPoint pt;
  if (auto st = LookUpShape(p, where, shapes, &pt.shape_name, &pt.shape); !st.ok()) return st;
  if (p.contains("kv_dtype_bytes")) pt.shape.kv_dtype_bytes = p["kv_dtype_bytes"].get<int>();
  auto b = Number(p, "decode_tokens", where, false);
  auto c = Number(p, "decode_context", where, false);
  auto pf = Number(p, "prefill_tokens", where, false);
  auto a = Number(p, "prefill_attention", where, false);
  auto ms = Number(p, "ms", where);
  for (const auto* st : {&b, &c, &pf, &a, &ms}) {
    if (!st->ok()) return st->status();
  }
  // The prompts of the prefill (one sampled row each): 1 unless the point
  // says ("prompts": a step of many prompts, an integer in [1, P]).
  int logits = *pf > 0 ? 1 : 0;
  if (p.contains("prompts")) {
    if (!p["prompts"].is_number_integer() || p["prompts"].get<int64_t>() < 1 ||
        p["prompts"].get<double>() > *pf) {
      return absl::InvalidArgumentError(
          absl::StrCat(where, ".prompts: an integer from 1 to the point's prefill_tokens"));
    }
    logits = p["prompts"].get<int>();
  }
  pt.work = {static_cast<int>(*b), *c, static_cast<int>(*pf), *a, logits};
  pt.seconds = *ms / 1e3;
  if (pt.seconds <= 0 || (pt.work.decode_tokens == 0 && pt.work.prefill_tokens == 0)) {
    return absl::InvalidArgumentError(
        absl::StrCat(where, ": a step needs ms > 0 and decode or prefill tokens"));
  }
  return pt;
}

absl::StatusOr<ConcurrentPoint> ParseConcurrent(const nlohmann::json& p, const std::string& where,
                                                const std::map<std::string, ModelShape>& shapes) {
  ConcurrentPoint pt;
  if (auto st = LookUpShape(p, where, shapes, &pt.shape_name, &pt.shape); !st.ok()) return st;
  auto n = Number(p, "copies", where);
  auto b = Number(p, "decode_tokens", where);
  auto c = Number(p, "decode_context", where, false);
  auto ms = Number(p, "ms", where);
  auto alone = Number(p, "ms_alone", where);
  for (const auto* st : {&n, &b, &c, &ms, &alone}) {
    if (!st->ok()) return st->status();
  }
  for (const char* key : {"copies", "decode_tokens"}) {
    if (!p[key].is_number_integer()) {
      return absl::InvalidArgumentError(absl::StrCat(where, ".", key, ": an integer"));
    }
  }
  pt.copies = static_cast<int>(*n);
  pt.work = {static_cast<int>(*b), *c, 0, 0};
  pt.seconds = *ms / 1e3;
  pt.alone_seconds = *alone / 1e3;
  if (pt.copies < 2 || pt.work.decode_tokens <= 0 || pt.seconds <= 0 || pt.alone_seconds <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(where, ": needs copies >= 2, decode_tokens > 0, ms > 0 and ms_alone > 0"));
  }
  return pt;
}

// The optional "kv_tiers" object (KvLinkRates): each rate > 0.
absl::Status ParseKvRates(const nlohmann::json& j, const std::string& origin, Calibration* c) {
  if (!j.contains("kv_tiers")) return absl::OkStatus();
  const nlohmann::json& t = j["kv_tiers"];
  if (!t.is_object()) return FieldError(origin, "kv_tiers", "an object of load rates");
  const std::pair<const char*, double*> rates[] = {
      {"dram_load_bytes_per_s", &c->kv_rates.dram_bytes_per_s},
      {"ssd_load_bytes_per_s", &c->kv_rates.ssd_bytes_per_s},
      {"peer_load_bytes_per_s", &c->kv_rates.peer_bytes_per_s}};
  for (const auto& [key, out] : rates) {
    if (!t.contains(key)) continue;
    if (!t[key].is_number() || !(t[key].get<double>() > 0)) {
      return FieldError(origin, absl::StrCat("kv_tiers.", key), "a number > 0 (bytes/s)");
    }
    *out = t[key].get<double>();
  }
  c->kv_rates_source = t.value("source", "");
  return absl::OkStatus();
}

absl::StatusOr<Calibration> ParseCalibrationJson(const std::string& text,
                                                 const std::string& origin) {
  nlohmann::json j = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object()) return FieldError(origin, "(file)", "not a JSON object");
  Calibration c;
  c.device = j.value("device", "");
  c.date = j.value("date", "");
  c.command = j.value("command", "");
  auto mem = Number(j, "memory_bytes", origin);
  auto h2d = Number(j, "h2d_bytes_per_s", origin);
  auto ratio = Number(j, "activation_ratio", origin);
  for (const auto* st : {&mem, &h2d, &ratio}) {
    if (!st->ok()) return st->status();
  }
  c.memory_bytes = static_cast<int64_t>(*mem);
  c.h2d_bytes_per_s = *h2d;
  c.activation_ratio = *ratio;
  if (c.memory_bytes <= 0 || c.h2d_bytes_per_s <= 0 || c.activation_ratio < 1) {
    return FieldError(origin, "memory_bytes/h2d_bytes_per_s/activation_ratio",
                      "must be > 0 (activation_ratio >= 1)");
  }
  if (auto st = ParseKvRates(j, origin, &c); !st.ok()) return st;
  if (!j.contains("shapes") || !j["shapes"].is_object()) {
    return FieldError(origin, "shapes", "an object of model shapes");
  }
  std::map<std::string, ModelShape> shapes;
  for (const auto& [name, s] : j["shapes"].items()) {
    auto shape = ParseShape(s, absl::StrCat(origin, ": shapes.", name));
    if (!shape.ok()) return shape.status();
    shapes[name] = *shape;
  }
  if (!j.contains("points") || !j["points"].is_array()) {
    return FieldError(origin, "points", "an array of measured steps");
  }
  for (size_t i = 0; i < j["points"].size(); ++i) {
    auto pt = ParsePoint(j["points"][i], absl::StrCat(origin, ": points[", i, "]"), shapes);
    if (!pt.ok()) return pt.status();
    c.points.push_back(*std::move(pt));
  }
  if (j.contains("concurrent")) {
    if (!j["concurrent"].is_array()) {
      return FieldError(origin, "concurrent", "an array of concurrent steps");
    }
    for (size_t i = 0; i < j["concurrent"].size(); ++i) {
      auto pt = ParseConcurrent(j["concurrent"][i], absl::StrCat(origin, ": concurrent[", i, "]"),
                                shapes);
      if (!pt.ok()) return pt.status();
      c.concurrent.push_back(*std::move(pt));
    }
  }
  return c;
}

}  // namespace

absl::StatusOr<Calibration> ParseCalibration(const std::string& text, const std::string& origin) {
  // nlohmann throws on a field of the wrong type ("device": 1).
  try {
    return ParseCalibrationJson(text, origin);
  } catch (const nlohmann::json::exception& e) {
    return absl::InvalidArgumentError(absl::StrCat(origin, ": ", e.what()));
  }
}

absl::StatusOr<Calibration> ReadCalibration(const std::string& path) {
  std::ifstream in(path);
  if (!in) return absl::NotFoundError(absl::StrCat(path, ": cannot open the calibration file"));
  std::stringstream ss;
  ss << in.rdbuf();
  return ParseCalibration(ss.str(), path);
}

}  // namespace ballast::sim
