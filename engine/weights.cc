#include "engine/weights.h"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <map>
#include <memory>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "engine/safetensors.h"

namespace ballast::engine {
namespace {

class TensorIndex {
 public:
  absl::Status Open(const std::string& dir) {
    std::vector<std::string> paths;
    std::error_code ec;
    for (const auto& e : std::filesystem::directory_iterator(dir, ec)) {
      if (e.path().extension() == ".safetensors") paths.push_back(e.path().string());
    }
    if (ec) return absl::NotFoundError(absl::StrCat("cannot list ", dir, ": ", ec.message()));
    if (paths.empty()) return absl::NotFoundError(absl::StrCat(dir, ": no *.safetensors files"));
    std::sort(paths.begin(), paths.end());
    for (const auto& p : paths) {
      auto f = SafetensorsFile::Open(p);
      if (!f.ok()) return f.status();
      for (const auto& [name, view] : (*f)->tensors()) index_[name] = {f->get(), &view};
      files_.push_back(std::move(*f));
    }
    return absl::OkStatus();
  }

  bool Has(const std::string& name) const { return index_.count(name) > 0; }

  // Converts tensor `name` to float32, checking its shape ({rows, cols}, or
  // {cols} for a vector when rows == 0) and that every value is finite.
  absl::StatusOr<Matrix> Get(const std::string& name, int rows, int cols) {
    auto it = index_.find(name);
    if (it == index_.end()) {
      return absl::NotFoundError(absl::StrCat("tensor \"", name, "\" is missing from the checkpoint"));
    }
    const auto& [file, view] = it->second;
    std::vector<int64_t> want = rows == 0 ? std::vector<int64_t>{cols}
                                          : std::vector<int64_t>{rows, cols};
    if (view->shape != want) {
      return absl::InvalidArgumentError(
          absl::StrCat(file->path(), ": tensor \"", name, "\" has shape [",
                       absl::StrJoin(view->shape, ", "), "], config.json implies [",
                       absl::StrJoin(want, ", "), "]"));
    }
    Matrix m;
    m.rows = rows == 0 ? 1 : rows;
    m.cols = cols;
    m.data.resize(static_cast<size_t>(view->numel()));
    ToFloat(view->dtype, view->data, m.data.data(), m.data.size());
    for (float x : m.data) {
      if (!std::isfinite(x)) {
        return absl::DataLossError(absl::StrCat(file->path(), ": tensor \"", name,
                                                "\" holds non-finite values: corrupt file?"));
      }
    }
    stored_bytes_ += static_cast<int64_t>(view->nbytes);
    return m;
  }

  int64_t stored_bytes() const { return stored_bytes_; }

 private:
  std::vector<std::unique_ptr<SafetensorsFile>> files_;
  std::map<std::string, std::pair<SafetensorsFile*, const TensorView*>> index_;
  int64_t stored_bytes_ = 0;
};

}  // namespace

absl::StatusOr<ModelWeights> ModelWeights::Load(const std::string& dir, const ModelConfig& c) {
  TensorIndex idx;
  if (auto s = idx.Open(dir); !s.ok()) return s;
  ModelWeights w;
  absl::Status status;
  auto get = [&](const std::string& name, int rows, int cols, Matrix* out) {
    if (!status.ok()) return;
    auto m = idx.Get(name, rows, cols);
    if (!m.ok()) {
      status = m.status();
      return;
    }
    *out = std::move(*m);
  };
  const int h = c.hidden_size;
  get("model.embed_tokens.weight", c.vocab_size, h, &w.embed);
  w.layers.resize(c.num_hidden_layers);
  for (int l = 0; l < c.num_hidden_layers; ++l) {
    const std::string p = absl::StrCat("model.layers.", l, ".");
    LayerWeights& L = w.layers[l];
    get(p + "input_layernorm.weight", 0, h, &L.input_norm);
    get(p + "self_attn.q_proj.weight", c.q_dim(), h, &L.q);
    get(p + "self_attn.k_proj.weight", c.kv_dim(), h, &L.k);
    get(p + "self_attn.v_proj.weight", c.kv_dim(), h, &L.v);
    get(p + "self_attn.o_proj.weight", h, c.q_dim(), &L.o);
    if (c.qkv_bias) {
      get(p + "self_attn.q_proj.bias", 0, c.q_dim(), &L.q_bias);
      get(p + "self_attn.k_proj.bias", 0, c.kv_dim(), &L.k_bias);
      get(p + "self_attn.v_proj.bias", 0, c.kv_dim(), &L.v_bias);
    }
    if (c.o_bias) get(p + "self_attn.o_proj.bias", 0, h, &L.o_bias);
    get(p + "post_attention_layernorm.weight", 0, h, &L.post_norm);
    get(p + "mlp.gate_proj.weight", c.intermediate_size, h, &L.gate);
    get(p + "mlp.up_proj.weight", c.intermediate_size, h, &L.up);
    get(p + "mlp.down_proj.weight", h, c.intermediate_size, &L.down);
  }
  get("model.norm.weight", 0, h, &w.final_norm);
  if (!c.tie_word_embeddings) get("lm_head.weight", c.vocab_size, h, &w.lm_head);
  if (!status.ok()) return status;
  w.stored_bytes = idx.stored_bytes();
  return w;
}

}  // namespace ballast::engine
