#include "engine/kv_cache.h"

#include <algorithm>
#include <cassert>

#include "spdlog/spdlog.h"

namespace ballast::engine {

KvCache::KvCache(const KvLayout& layout, memory::BlockAllocator* allocator)
    : layout_(layout), allocator_(allocator) {
  assert(allocator_->block_bytes() >= layout_.block_bytes());
}

int KvCache::BlocksNeeded(const SequenceKv& seq, int tokens) const {
  const int want = (tokens + layout_.block_tokens - 1) / layout_.block_tokens;
  int n = 0;
  for (int l = 0; l < layout_.num_layers; ++l) {
    const int have =
        static_cast<size_t>(l) < seq.blocks.size() ? static_cast<int>(seq.blocks[l].size()) : 0;
    n += std::max(want - have, 0);
  }
  return n;
}

absl::Status KvCache::Reserve(SequenceKv* seq, int tokens) {
  const int n = BlocksNeeded(*seq, tokens);
  if (n == 0) return absl::OkStatus();
  auto got = allocator_->Allocate(n);
  if (!got.ok()) return got.status();
  if (seq->blocks.size() < static_cast<size_t>(layout_.num_layers)) {
    seq->blocks.resize(layout_.num_layers);
  }
  const size_t want =
      static_cast<size_t>((tokens + layout_.block_tokens - 1) / layout_.block_tokens);
  size_t k = 0;
  for (auto& layer : seq->blocks) {
    while (layer.size() < want) layer.push_back((*got)[k++]);
  }
  return absl::OkStatus();
}

int64_t KvCache::FreeBlocks(size_t layer, const std::vector<memory::BlockId>& ids) {
  if (absl::Status st = allocator_->Free(ids); !st.ok()) {
    // A block table the allocator refuses is an engine bug. The allocator
    // freed nothing of it (all or nothing); callers keep going so other
    // layers' blocks are not leaked, and drop the table so it cannot be
    // freed twice.
    release_errors_.fetch_add(1, std::memory_order_relaxed);
    spdlog::error("KV cache: freeing {} blocks of layer {} of a sequence was refused: {}",
                  ids.size(), layer, st.ToString());
    return 0;
  }
  return static_cast<int64_t>(ids.size());
}

int64_t KvCache::ReleaseLayers(SequenceKv* seq, int first_layer) {
  int64_t freed = 0;
  for (size_t l = std::max(first_layer, 0); l < seq->blocks.size(); ++l) {
    freed += FreeBlocks(l, seq->blocks[l]);
    seq->blocks[l].clear();
  }
  return freed;
}

int64_t KvCache::Truncate(SequenceKv* seq, int tokens) {
  const size_t keep =
      static_cast<size_t>((std::max(tokens, 0) + layout_.block_tokens - 1) / layout_.block_tokens);
  int64_t freed = 0;
  for (size_t l = 0; l < seq->blocks.size(); ++l) {
    std::vector<memory::BlockId>& ids = seq->blocks[l];
    if (ids.size() <= keep) continue;
    freed += FreeBlocks(l, {ids.begin() + static_cast<std::ptrdiff_t>(keep), ids.end()});
    ids.resize(keep);
  }
  return freed;
}

void KvCache::Release(SequenceKv* seq) {
  ReleaseLayers(seq, 0);
  seq->blocks.clear();
}

uint8_t* KvCache::Slot(const SequenceKv& seq, int layer, int pos, bool value) const {
  const int T = layout_.block_tokens;
  memory::BlockId b = seq.blocks[layer][pos / T];
  uint8_t* base = allocator_->Address(b);
  const size_t half = static_cast<size_t>(T) * layout_.token_bytes();
  return base + (value ? half : 0) + static_cast<size_t>(pos % T) * layout_.token_bytes();
}

void KvCache::Write(const SequenceKv& seq, int layer, int pos, const float* k, const float* v) {
  const size_t n = static_cast<size_t>(layout_.num_kv_heads) * layout_.head_dim;
  if (layout_.dtype == DType::kFP8E4M3) {
    uint8_t* ks = Slot(seq, layer, pos, false);
    uint8_t* vs = Slot(seq, layer, pos, true);
    for (size_t i = 0; i < n; ++i) {
      ks[i] = FloatToFp8E4M3(k[i] / layout_.k_scale);
      vs[i] = FloatToFp8E4M3(v[i] / layout_.v_scale);
    }
    return;
  }
  FromFloat(layout_.dtype, k, Slot(seq, layer, pos, false), n);
  FromFloat(layout_.dtype, v, Slot(seq, layer, pos, true), n);
}

void KvCache::ReadK(const SequenceKv& seq, int layer, int pos, int head, float* out) const {
  const size_t off = static_cast<size_t>(head) * layout_.head_dim * DTypeSize(layout_.dtype);
  ToFloat(layout_.dtype, Slot(seq, layer, pos, false) + off, out, layout_.head_dim);
  if (layout_.dtype == DType::kFP8E4M3) {
    for (int i = 0; i < layout_.head_dim; ++i) out[i] *= layout_.k_scale;
  }
}

void KvCache::ReadV(const SequenceKv& seq, int layer, int pos, int head, float* out) const {
  const size_t off = static_cast<size_t>(head) * layout_.head_dim * DTypeSize(layout_.dtype);
  ToFloat(layout_.dtype, Slot(seq, layer, pos, true) + off, out, layout_.head_dim);
  if (layout_.dtype == DType::kFP8E4M3) {
    for (int i = 0; i < layout_.head_dim; ++i) out[i] *= layout_.v_scale;
  }
}

}  // namespace ballast::engine
