#include "engine/cuda/device_weights.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "engine/checkpoint.h"

namespace ballast::engine::cuda {
namespace {

// One destination of the upload: tensor `name` of shape {rows, cols} (a
// vector when rows == 0) copied to `offset` bytes into slot `*slot`'s range.
struct Piece {
  std::string name;
  int rows = 0, cols = 0;
  void** slot = nullptr;
  size_t offset = 0;  // bytes from the slot's start
};

absl::StatusOr<SrcType> SourceType(DType t, const std::string& name) {
  switch (t) {
    case DType::kF32: return SrcType::kF32;
    case DType::kBF16: return SrcType::kBF16;
    case DType::kF16: return SrcType::kF16;
    default:
      return absl::InvalidArgumentError(
          absl::StrCat("tensor \"", name, "\": weights must be F32, BF16 or F16"));
  }
}

bool SameType(SrcType src, ActType type) {
  return (src == SrcType::kBF16 && type == ActType::kBF16) ||
         (src == SrcType::kF16 && type == ActType::kF16);
}

}  // namespace

absl::StatusOr<std::unique_ptr<DeviceWeights>> DeviceWeights::Load(const std::string& dir,
                                                                   const ModelConfig& c,
                                                                   ActType type,
                                                                   cudaStream_t stream) {
  CheckpointIndex idx;
  if (auto s = idx.Open(dir); !s.ok()) return s;
  std::unique_ptr<DeviceWeights> w(new DeviceWeights());
  w->type_ = type;
  w->layers_.resize(c.num_hidden_layers);
  const size_t esz = ActSize(type);
  const int h = c.hidden_size, q = c.q_dim(), kv = c.kv_dim(), inter = c.intermediate_size;

  // Slots in allocation order with their sizes in elements.
  std::vector<std::pair<void**, size_t>> slots;
  std::vector<Piece> pieces;
  auto slot = [&](void** s, size_t elems) { slots.push_back({s, elems}); };
  auto piece = [&](const std::string& name, int rows, int cols, void** s, size_t elem_offset) {
    pieces.push_back({name, rows, cols, s, elem_offset * esz});
  };
  slot(&w->embed_, static_cast<size_t>(c.vocab_size) * h);
  piece("model.embed_tokens.weight", c.vocab_size, h, &w->embed_, 0);
  for (int l = 0; l < c.num_hidden_layers; ++l) {
    DeviceLayer& L = w->layers_[l];
    const std::string p = absl::StrCat("model.layers.", l, ".");
    slot(&L.input_norm, h);
    piece(p + "input_layernorm.weight", 0, h, &L.input_norm, 0);
    slot(&L.qkv, static_cast<size_t>(q + 2 * kv) * h);
    piece(p + "self_attn.q_proj.weight", q, h, &L.qkv, 0);
    piece(p + "self_attn.k_proj.weight", kv, h, &L.qkv, static_cast<size_t>(q) * h);
    piece(p + "self_attn.v_proj.weight", kv, h, &L.qkv, static_cast<size_t>(q + kv) * h);
    if (c.qkv_bias) {
      slot(&L.qkv_bias, q + 2 * kv);
      piece(p + "self_attn.q_proj.bias", 0, q, &L.qkv_bias, 0);
      piece(p + "self_attn.k_proj.bias", 0, kv, &L.qkv_bias, q);
      piece(p + "self_attn.v_proj.bias", 0, kv, &L.qkv_bias, q + kv);
    }
    slot(&L.o, static_cast<size_t>(h) * q);
    piece(p + "self_attn.o_proj.weight", h, q, &L.o, 0);
    if (c.o_bias) {
      slot(&L.o_bias, h);
      piece(p + "self_attn.o_proj.bias", 0, h, &L.o_bias, 0);
    }
    slot(&L.post_norm, h);
    piece(p + "post_attention_layernorm.weight", 0, h, &L.post_norm, 0);
    slot(&L.gate_up, static_cast<size_t>(2 * inter) * h);
    piece(p + "mlp.gate_proj.weight", inter, h, &L.gate_up, 0);
    piece(p + "mlp.up_proj.weight", inter, h, &L.gate_up, static_cast<size_t>(inter) * h);
    slot(&L.down, static_cast<size_t>(h) * inter);
    piece(p + "mlp.down_proj.weight", h, inter, &L.down, 0);
  }
  slot(&w->final_norm_, h);
  piece("model.norm.weight", 0, h, &w->final_norm_, 0);
  if (!c.tie_word_embeddings) {
    slot(&w->lm_head_, static_cast<size_t>(c.vocab_size) * h);
    piece("lm_head.weight", c.vocab_size, h, &w->lm_head_, 0);
  }

  // Check every tensor before allocating anything.
  std::vector<const TensorView*> views;
  size_t staging = 0;
  for (const Piece& pc : pieces) {
    auto v = idx.Get(pc.name, pc.rows, pc.cols);
    if (!v.ok()) return v.status();
    auto src = SourceType((*v)->dtype, pc.name);
    if (!src.ok()) return absl::InvalidArgumentError(absl::StrCat(idx.FileOf(pc.name), ": ", src.status().message()));
    views.push_back(*v);
    if (!SameType(*src, type)) staging = std::max(staging, (*v)->nbytes);
  }
  constexpr size_t kAlign = 256;
  size_t total = 0;
  std::vector<size_t> offsets;
  for (const auto& [s, elems] : slots) {
    offsets.push_back(total);
    total += (elems * esz + kAlign - 1) / kAlign * kAlign;
  }
  if (auto s = w->storage_.Allocate(total, "model weights"); !s.ok()) {
    return absl::ResourceExhaustedError(absl::StrCat("model weights need ", total, " bytes on the GPU: ", s.message()));
  }
  for (size_t i = 0; i < slots.size(); ++i) *slots[i].first = w->storage_.get<uint8_t>() + offsets[i];
  if (c.tie_word_embeddings) w->lm_head_ = w->embed_;

  DeviceBuffer stage;
  if (staging > 0) {
    if (auto s = stage.Allocate(staging, "weight staging"); !s.ok()) return s;
  }
  for (size_t i = 0; i < pieces.size(); ++i) {
    const TensorView* v = views[i];
    uint8_t* dst = static_cast<uint8_t*>(*pieces[i].slot) + pieces[i].offset;
    const SrcType src = *SourceType(v->dtype, v->name);
    if (SameType(src, type)) {
      BALLAST_CUDA_RETURN(cudaMemcpyAsync(dst, v->data, v->nbytes, cudaMemcpyHostToDevice, stream),
                          "weight upload");
      continue;
    }
    BALLAST_CUDA_RETURN(cudaMemcpyAsync(stage.get(), v->data, v->nbytes, cudaMemcpyHostToDevice, stream),
                        "weight upload");
    BALLAST_CUDA_RETURN(LaunchConvert(stage.get(), src, dst, type, static_cast<size_t>(v->numel()), stream),
                        "weight conversion");
  }
  BALLAST_CUDA_RETURN(cudaStreamSynchronize(stream), "weight upload");
  return w;
}

}  // namespace ballast::engine::cuda
