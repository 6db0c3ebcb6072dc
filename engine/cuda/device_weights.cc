#include "engine/cuda/device_weights.h"

#include <algorithm>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "engine/checkpoint.h"
#include "transfer/cuda/bulk_copy.h"

namespace ballast::engine::cuda {

// One destination of the upload: tensor `name` of shape {rows, cols} (a
// vector when rows == 0) copied to `dst`.
struct DeviceWeights::Piece {
  std::string name;
  int rows = 0, cols = 0;
  uint8_t* dst = nullptr;
  float* scale = nullptr;  // FP8: the rows' scales go here, dst holds E4M3 bytes
  bool fp8 = false;        // an FP8 linear weight (scale is null while sizing)
};

// A piece's source in the checkpoint; FP8 tensors come with their row scales.
struct DeviceWeights::Source {
  const TensorView* view = nullptr;
  std::vector<float> scales;  // E4M3 tensors of an FP8 checkpoint: one per row
};

namespace {

absl::StatusOr<SrcType> SourceType(DType t, const std::string& name) {
  switch (t) {
    case DType::kF32:
      return SrcType::kF32;
    case DType::kBF16:
      return SrcType::kBF16;
    case DType::kF16:
      return SrcType::kF16;
    default:
      return absl::InvalidArgumentError(
          absl::StrCat("tensor \"", name, "\": weights must be F32, BF16 or F16"));
  }
}

bool SameType(SrcType src, ActType type) {
  return (src == SrcType::kBF16 && type == ActType::kBF16) ||
         (src == SrcType::kF16 && type == ActType::kF16);
}

constexpr size_t kAlign = 256;

}  // namespace

absl::StatusOr<std::shared_ptr<PinnedWeights>> PinnedWeights::Allocate(size_t bytes, ActType type) {
  std::shared_ptr<PinnedWeights> img(new PinnedWeights());
  img->type_ = type;
  uint8_t* data = nullptr;
  BALLAST_CUDA_RETURN(cudaHostAlloc(reinterpret_cast<void**>(&data), std::max<size_t>(bytes, 1),
                                    cudaHostAllocDefault),
                      "pinned host copy of the weights");
  img->chunks_ = HostChunks{{data}, std::max<size_t>(bytes, 1), bytes};
  return img;
}

absl::StatusOr<std::shared_ptr<PinnedWeights>> PinnedWeights::FromArena(
    std::shared_ptr<HostArena> arena, size_t bytes, ActType type) {
  auto chunks = arena->Take(bytes);
  if (!chunks.ok()) return chunks.status();
  std::shared_ptr<PinnedWeights> img(new PinnedWeights());
  img->type_ = type;
  img->chunks_ = std::move(*chunks);
  img->arena_ = std::move(arena);
  return img;
}

PinnedWeights::~PinnedWeights() {
  if (arena_) {
    arena_->Give(chunks_);
  } else if (!chunks_.chunks.empty()) {
    cudaFreeHost(chunks_.chunks[0]);
  }
}

void PinnedWeights::Fill(uint8_t value) {
  chunks_.ForEachPiece(0, chunks_.bytes,
                       [value](uint8_t* host, size_t, size_t n) { std::memset(host, value, n); });
}

cudaError_t PinnedWeights::CopyToDevice(void* dst, size_t offset, size_t n,
                                        cudaStream_t stream) const {
  cudaError_t err = cudaSuccess;
  auto* d = static_cast<uint8_t*>(dst);
  chunks_.ForEachPiece(offset, n, [&](uint8_t* host, size_t o, size_t len) {
    if (err == cudaSuccess) {
      err = cudaMemcpyAsync(d + (o - offset), host, len, cudaMemcpyHostToDevice, stream);
    }
  });
  return err;
}

DeviceLayer DeviceLayer::Shifted(ptrdiff_t delta) const {
  DeviceLayer L = *this;
  for (void** p : {&L.input_norm, &L.qkv, &L.qkv_bias, &L.o, &L.o_bias, &L.q_norm, &L.k_norm,
                   &L.post_norm, &L.gate_up, &L.down}) {
    if (*p) *p = static_cast<uint8_t*>(*p) + delta;
  }
  for (float** p : {&L.qkv_scale, &L.o_scale, &L.gate_up_scale, &L.down_scale}) {
    if (*p) *p = reinterpret_cast<float*>(reinterpret_cast<uint8_t*>(*p) + delta);
  }
  return L;
}

// Lays an image out slot by slot (addresses null when sizing: base null)
// and lists what to copy where (when `pieces` is set).
struct DeviceWeights::Carver {
  uint8_t* base = nullptr;
  size_t esz = 2;    // activation type bytes
  bool fp8 = false;  // linear weights in E4M3 with row scales
  std::vector<Piece>* pieces = nullptr;
  size_t off = 0;

  uint8_t* Carve(size_t bytes) {
    uint8_t* at = base ? base + off : nullptr;
    off += (bytes + kAlign - 1) / kAlign * kAlign;
    return at;
  }
  // A slot of `elems` activation-type elements.
  void Slot(void** s, size_t elems) { *s = Carve(elems * esz); }
  // Tensor `name` ({rows, cols}; a vector when rows == 0) at element
  // `elem_offset` of slot s.
  void Tensor(const std::string& name, int rows, int cols, void* s, size_t elem_offset) {
    if (pieces) pieces->push_back({name, rows, cols, static_cast<uint8_t*>(s) + elem_offset * esz});
  }
  // A linear weight of `rows` x `cols`: activation type, or E4M3 bytes
  // followed by `rows` float scales.
  void Linear(void** s, float** scale, int rows, int cols) {
    const size_t elems = static_cast<size_t>(rows) * cols;
    if (!fp8) return Slot(s, elems);
    *s = Carve(elems);
    *scale = reinterpret_cast<float*>(Carve(static_cast<size_t>(rows) * sizeof(float)));
  }
  // Linear tensor `name` ({rows, cols}) at row `row0` of linear slot s.
  void Part(const std::string& name, int rows, int cols, void* s, float* scale, int row0) {
    if (!pieces) return;
    if (!fp8) return Tensor(name, rows, cols, s, static_cast<size_t>(row0) * cols);
    pieces->push_back({name, rows, cols,
                       static_cast<uint8_t*>(s) + static_cast<size_t>(row0) * cols,
                       scale ? scale + row0 : nullptr, true});
  }
};

void DeviceWeights::LayoutLayer(const ModelConfig& c, int l, Carver* k) {
  const int h = c.hidden_size, q = c.q_dim(), kv = c.kv_dim(), inter = c.intermediate_size;
  DeviceLayer& L = layers_[l];
  const std::string p = absl::StrCat("model.layers.", l, ".");
  k->Slot(&L.input_norm, h);
  k->Tensor(p + "input_layernorm.weight", 0, h, L.input_norm, 0);
  k->Linear(&L.qkv, &L.qkv_scale, q + 2 * kv, h);
  k->Part(p + "self_attn.q_proj.weight", q, h, L.qkv, L.qkv_scale, 0);
  k->Part(p + "self_attn.k_proj.weight", kv, h, L.qkv, L.qkv_scale, q);
  k->Part(p + "self_attn.v_proj.weight", kv, h, L.qkv, L.qkv_scale, q + kv);
  if (c.qkv_bias) {
    k->Slot(&L.qkv_bias, q + 2 * kv);
    k->Tensor(p + "self_attn.q_proj.bias", 0, q, L.qkv_bias, 0);
    k->Tensor(p + "self_attn.k_proj.bias", 0, kv, L.qkv_bias, q);
    k->Tensor(p + "self_attn.v_proj.bias", 0, kv, L.qkv_bias, q + kv);
  }
  k->Linear(&L.o, &L.o_scale, h, q);
  k->Part(p + "self_attn.o_proj.weight", h, q, L.o, L.o_scale, 0);
  if (c.o_bias) {
    k->Slot(&L.o_bias, h);
    k->Tensor(p + "self_attn.o_proj.bias", 0, h, L.o_bias, 0);
  }
  if (c.qk_norm) {
    k->Slot(&L.q_norm, c.head_dim);
    k->Tensor(p + "self_attn.q_norm.weight", 0, c.head_dim, L.q_norm, 0);
    k->Slot(&L.k_norm, c.head_dim);
    k->Tensor(p + "self_attn.k_norm.weight", 0, c.head_dim, L.k_norm, 0);
  }
  k->Slot(&L.post_norm, h);
  k->Tensor(p + "post_attention_layernorm.weight", 0, h, L.post_norm, 0);
  k->Linear(&L.gate_up, &L.gate_up_scale, 2 * inter, h);
  k->Part(p + "mlp.gate_proj.weight", inter, h, L.gate_up, L.gate_up_scale, 0);
  k->Part(p + "mlp.up_proj.weight", inter, h, L.gate_up, L.gate_up_scale, inter);
  k->Linear(&L.down, &L.down_scale, h, inter);
  k->Part(p + "mlp.down_proj.weight", h, inter, L.down, L.down_scale, 0);
}

size_t DeviceWeights::Layout(const ModelConfig& c, uint8_t* base, std::vector<Piece>* pieces) {
  layers_.assign(c.num_hidden_layers, DeviceLayer{});
  Carver k{base, ActSize(type_), c.weight_quant == WeightQuant::kFp8, pieces};
  const int h = c.hidden_size;
  k.Slot(&embed_, static_cast<size_t>(c.vocab_size) * h);
  k.Tensor("model.embed_tokens.weight", c.vocab_size, h, embed_, 0);
  for (int l = 0; l < c.num_hidden_layers; ++l) LayoutLayer(c, l, &k);
  k.Slot(&final_norm_, h);
  k.Tensor("model.norm.weight", 0, h, final_norm_, 0);
  if (!c.tie_word_embeddings) {
    k.Slot(&lm_head_, static_cast<size_t>(c.vocab_size) * h);
    k.Tensor("lm_head.weight", c.vocab_size, h, lm_head_, 0);
  } else {
    lm_head_ = embed_;
  }
  return k.off;
}

LayerExtent DeviceWeights::layer_extent(int l) const {
  auto at = [&](const void* p) {
    return static_cast<size_t>(static_cast<const uint8_t*>(p) - base_);
  };
  const size_t start = at(layers_[l].input_norm);
  const size_t end =
      l + 1 < static_cast<int>(layers_.size()) ? at(layers_[l + 1].input_norm) : at(final_norm_);
  return {start, end - start};
}

int64_t DeviceWeights::Bytes(const ModelConfig& config, ActType type) {
  DeviceWeights w;
  w.type_ = type;
  return static_cast<int64_t>(w.Layout(config, nullptr, nullptr));
}

absl::Status DeviceWeights::Place(const ModelConfig& c, WeightDest dest) {
  bytes_ = Layout(c, nullptr, nullptr);
  if (dest.at != nullptr) {
    if (dest.capacity < bytes_) {
      return absl::InvalidArgumentError(
          absl::StrCat("weight pages hold ", dest.capacity, " bytes; the weights need ", bytes_));
    }
    base_ = dest.at;
    return absl::OkStatus();
  }
  if (auto s = storage_.Allocate(bytes_, "model weights"); !s.ok()) {
    return absl::ResourceExhaustedError(
        absl::StrCat("model weights need ", bytes_, " bytes on the GPU: ", s.message()));
  }
  base_ = storage_.get<uint8_t>();
  return absl::OkStatus();
}

absl::Status DeviceWeights::CheckSources(const CheckpointIndex& idx, const ModelConfig& c,
                                         const std::vector<Piece>& pieces,
                                         std::vector<Source>* sources, size_t* staging) const {
  for (const Piece& pc : pieces) {
    auto v = idx.Get(pc.name, pc.rows, pc.cols);
    if (!v.ok()) return v.status();
    Source src{*v, {}};
    if ((*v)->dtype == DType::kFP8E4M3) {
      if (!pc.fp8) {
        return absl::InvalidArgumentError(absl::StrCat(
            idx.FileOf(pc.name), ": tensor \"", pc.name,
            "\" is F8_E4M3; only the linear layers' weights of an FP8 checkpoint may be"));
      }
      auto scales = idx.Fp8RowScales(pc.name, pc.rows);
      if (!scales.ok()) return scales.status();
      src.scales = std::move(*scales);
    } else {
      auto t = SourceType((*v)->dtype, pc.name);
      if (!t.ok()) {
        return absl::InvalidArgumentError(
            absl::StrCat(idx.FileOf(pc.name), ": ", t.status().message()));
      }
      if (!SameType(*t, type_) || c.weight_quant == WeightQuant::kFp8) {
        *staging = std::max(*staging, (*v)->nbytes);
      }
    }
    sources->push_back(std::move(src));
  }
  return absl::OkStatus();
}

absl::Status DeviceWeights::Upload(const Piece& pc, const Source& src, void* stage,
                                   cudaStream_t stream) const {
  const TensorView* v = src.view;
  if (!src.scales.empty()) {  // E4M3 bytes and scales as stored
    BALLAST_CUDA_RETURN(cudaMemcpyAsync(pc.dst, v->data, v->nbytes, cudaMemcpyHostToDevice, stream),
                        "weight upload");
    BALLAST_CUDA_RETURN(
        cudaMemcpyAsync(pc.scale, src.scales.data(), src.scales.size() * sizeof(float),
                        cudaMemcpyHostToDevice, stream),
        "weight scales upload");
    return absl::OkStatus();
  }
  const SrcType t = *SourceType(v->dtype, v->name);
  if (pc.scale == nullptr && SameType(t, type_)) {
    BALLAST_CUDA_RETURN(cudaMemcpyAsync(pc.dst, v->data, v->nbytes, cudaMemcpyHostToDevice, stream),
                        "weight upload");
    return absl::OkStatus();
  }
  BALLAST_CUDA_RETURN(cudaMemcpyAsync(stage, v->data, v->nbytes, cudaMemcpyHostToDevice, stream),
                      "weight upload");
  if (pc.scale != nullptr) {  // FP8: quantized from the checkpoint's own precision
    BALLAST_CUDA_RETURN(LaunchQuantizeRowsFp8(stage, t, pc.rows, pc.cols, pc.dst, pc.scale, stream),
                        "weight quantization");
    return absl::OkStatus();
  }
  BALLAST_CUDA_RETURN(
      LaunchConvert(stage, t, pc.dst, type_, static_cast<size_t>(v->numel()), stream),
      "weight conversion");
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<DeviceWeights>> DeviceWeights::Load(const std::string& dir,
                                                                   const ModelConfig& c,
                                                                   ActType type,
                                                                   cudaStream_t stream,
                                                                   WeightDest dest) {
  CheckpointIndex idx;
  if (auto s = idx.Open(dir); !s.ok()) return s;
  std::unique_ptr<DeviceWeights> w(new DeviceWeights());
  w->type_ = type;
  std::vector<Piece> pieces;
  w->Layout(c, nullptr, &pieces);  // names and shapes, to check first
  std::vector<Source> sources;
  size_t staging = 0;
  if (auto s = w->CheckSources(idx, c, pieces, &sources, &staging); !s.ok()) return s;
  if (auto s = w->Place(c, dest); !s.ok()) return s;
  pieces.clear();
  w->Layout(c, w->base_, &pieces);
  DeviceBuffer stage;
  if (staging > 0) {
    if (auto s = stage.Allocate(staging, "weight staging"); !s.ok()) return s;
  }
  for (size_t i = 0; i < pieces.size(); ++i) {
    if (auto s = w->Upload(pieces[i], sources[i], stage.get(), stream); !s.ok()) return s;
  }
  BALLAST_CUDA_RETURN(cudaStreamSynchronize(stream), "weight upload");
  return w;
}

absl::StatusOr<std::unique_ptr<DeviceWeights>> DeviceWeights::LoadFromHost(
    const PinnedWeights& image, const ModelConfig& c, ActType type, int streams, WeightDest dest) {
  std::unique_ptr<DeviceWeights> w(new DeviceWeights());
  w->type_ = type;
  if (image.type() != type ||
      static_cast<int64_t>(w->Layout(c, nullptr, nullptr)) != image.image_bytes()) {
    return absl::InvalidArgumentError(
        "host weight copy does not match the model's config and activation type");
  }
  if (auto s = w->Place(c, dest); !s.ok()) return s;
  w->Layout(c, w->base_, nullptr);
  transfer::cuda::BulkCopyOptions copy;
  copy.streams = std::max(1, streams);
  std::vector<transfer::cuda::CopyRange> ranges;
  image.chunks().ForEachPiece(0, w->bytes_, [&](uint8_t* host, size_t off, size_t n) {
    ranges.push_back({w->base_ + off, host, n});
  });
  if (auto st = transfer::cuda::CopyRangesToDevice(ranges, copy); !st.ok()) {
    return absl::Status(st.code(), absl::StrCat("weights: ", st.message()));
  }
  return w;
}

absl::StatusOr<std::shared_ptr<PinnedWeights>> DeviceWeights::SaveToHost(
    const std::shared_ptr<HostArena>& arena) const {
  auto alloc = arena ? PinnedWeights::FromArena(arena, bytes_, type_)
                     : PinnedWeights::Allocate(bytes_, type_);
  if (!alloc.ok()) return alloc.status();
  std::shared_ptr<PinnedWeights> img = std::move(*alloc);
  std::vector<transfer::cuda::CopyRange> ranges;
  img->chunks().ForEachPiece(0, bytes_, [&](uint8_t* host, size_t off, size_t n) {
    ranges.push_back({host, base_ + off, n});
  });
  if (auto st = transfer::cuda::CopyRangesToHost(ranges); !st.ok()) {
    return absl::Status(st.code(), absl::StrCat("weights: ", st.message()));
  }
  return img;
}

}  // namespace ballast::engine::cuda
