#include "engine/weights.h"

#include <algorithm>
#include <cmath>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "engine/checkpoint.h"

namespace ballast::engine {
namespace {

// Converts tensor `name` to float32 ({rows, cols}, or {cols} for a vector
// when rows == 0), checking that every value is finite.
absl::StatusOr<Matrix> GetMatrix(const CheckpointIndex& idx, const std::string& name, int rows,
                                 int cols, int64_t* stored_bytes) {
  auto view = idx.Get(name, rows, cols);
  if (!view.ok()) return view.status();
  const TensorView* v = *view;
  Matrix m;
  m.rows = rows == 0 ? 1 : rows;
  m.cols = cols;
  m.data.resize(static_cast<size_t>(v->numel()));
  ToFloat(v->dtype, v->data, m.data.data(), m.data.size());
  for (float x : m.data) {
    if (!std::isfinite(x)) {
      return absl::DataLossError(absl::StrCat(idx.FileOf(name), ": tensor \"", name,
                                              "\" holds non-finite values: corrupt file?"));
    }
  }
  *stored_bytes += static_cast<int64_t>(v->nbytes);
  return m;
}

// When `name` is stored as E4M3 (an FP8 checkpoint), multiplies each row
// of `m` (its values as read) by the row's scale; returns whether it was.
absl::StatusOr<bool> ApplyFp8Scales(const CheckpointIndex& idx, const std::string& name,
                                    Matrix* m) {
  auto view = idx.Get(name, m->rows, m->cols);
  if (!view.ok() || (*view)->dtype != DType::kFP8E4M3) return false;
  auto scales = idx.Fp8RowScales(name, m->rows);
  if (!scales.ok()) return scales.status();
  for (int r = 0; r < m->rows; ++r) {
    float* row = m->data.data() + static_cast<size_t>(r) * m->cols;
    for (int i = 0; i < m->cols; ++i) row[i] *= (*scales)[static_cast<size_t>(r)];
  }
  return true;
}

}  // namespace

void RoundRowsToFp8(float* data, int rows, int cols, float* scales) {
  for (int r = 0; r < rows; ++r) {
    float* row = data + static_cast<size_t>(r) * cols;
    float amax = 0.0f;
    for (int i = 0; i < cols; ++i) amax = std::max(amax, std::fabs(row[i]));
    const float scale = amax > 0.0f ? amax / 448.0f : 1.0f;
    for (int i = 0; i < cols; ++i) row[i] = Fp8E4M3ToFloat(FloatToFp8E4M3(row[i] / scale)) * scale;
    if (scales != nullptr) scales[r] = scale;
  }
}

std::vector<float> RoundRowsToFp8(Matrix* m) {
  std::vector<float> scales(static_cast<size_t>(m->rows));
  RoundRowsToFp8(m->data.data(), m->rows, m->cols, scales.data());
  return scales;
}

absl::StatusOr<ModelWeights> ModelWeights::Load(const std::string& dir, const ModelConfig& c) {
  CheckpointIndex idx;
  if (auto s = idx.Open(dir); !s.ok()) return s;
  ModelWeights w;
  int64_t stored = 0;
  absl::Status status;
  auto get = [&](const std::string& name, int rows, int cols, Matrix* out) {
    if (!status.ok()) return;
    auto m = GetMatrix(idx, name, rows, cols, &stored);
    if (!m.ok()) {
      status = m.status();
      return;
    }
    *out = std::move(*m);
  };
  // Linear weights: an FP8 checkpoint's E4M3 tensors are kept as stored;
  // the others are rounded below when serving fp8.
  std::vector<Matrix*> to_round;
  auto linear = [&](const std::string& name, int rows, int cols, Matrix* out) {
    get(name, rows, cols, out);
    if (!status.ok()) return;
    auto fp8 = ApplyFp8Scales(idx, name, out);
    if (!fp8.ok()) status = fp8.status();
    if (fp8.ok() && !*fp8) to_round.push_back(out);
  };
  const int h = c.hidden_size;
  get("model.embed_tokens.weight", c.vocab_size, h, &w.embed);
  w.layers.resize(c.num_hidden_layers);
  for (int l = 0; l < c.num_hidden_layers; ++l) {
    const std::string p = absl::StrCat("model.layers.", l, ".");
    LayerWeights& L = w.layers[l];
    get(p + "input_layernorm.weight", 0, h, &L.input_norm);
    linear(p + "self_attn.q_proj.weight", c.q_dim(), h, &L.q);
    linear(p + "self_attn.k_proj.weight", c.kv_dim(), h, &L.k);
    linear(p + "self_attn.v_proj.weight", c.kv_dim(), h, &L.v);
    linear(p + "self_attn.o_proj.weight", h, c.q_dim(), &L.o);
    if (c.qkv_bias) {
      get(p + "self_attn.q_proj.bias", 0, c.q_dim(), &L.q_bias);
      get(p + "self_attn.k_proj.bias", 0, c.kv_dim(), &L.k_bias);
      get(p + "self_attn.v_proj.bias", 0, c.kv_dim(), &L.v_bias);
    }
    if (c.o_bias) get(p + "self_attn.o_proj.bias", 0, h, &L.o_bias);
    if (c.qk_norm) {
      get(p + "self_attn.q_norm.weight", 0, c.head_dim, &L.q_norm);
      get(p + "self_attn.k_norm.weight", 0, c.head_dim, &L.k_norm);
    }
    get(p + "post_attention_layernorm.weight", 0, h, &L.post_norm);
    linear(p + "mlp.gate_proj.weight", c.intermediate_size, h, &L.gate);
    linear(p + "mlp.up_proj.weight", c.intermediate_size, h, &L.up);
    linear(p + "mlp.down_proj.weight", h, c.intermediate_size, &L.down);
  }
  get("model.norm.weight", 0, h, &w.final_norm);
  if (!c.tie_word_embeddings) get("lm_head.weight", c.vocab_size, h, &w.lm_head);
  if (!status.ok()) return status;
  if (c.weight_quant == WeightQuant::kFp8) {
    for (Matrix* m : to_round) RoundRowsToFp8(m);
  }
  w.stored_bytes = stored;
  return w;
}

}  // namespace ballast::engine
