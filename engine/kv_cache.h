// KvCache: paged KV storage of one model, over a BlockAllocator.
//
// Layout. A block holds ONE layer's K and V for `block_tokens` consecutive
// positions of one sequence: K as [block_tokens][kv_heads][head_dim], then V
// with the same shape, in `dtype`, contiguous. A sequence's block table
// (SequenceKv) lists, per layer, the blocks covering positions
// [0, capacity). Keeping layers in separate blocks lets a session's KV be
// resident for some layers and not others; keeping a block contiguous keeps
// attention reads sequential. With block_tokens equal to the context
// window the cache degenerates to one contiguous buffer per layer.
//
// Thread-safety: KvCache is thread-compatible; the engine's step thread
// owns it (release_errors() may be read from any thread). The allocator
// underneath is thread-safe.
#pragma once

#include <atomic>
#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "engine/dtype.h"
#include "memory/block_allocator.h"

namespace ballast::engine {

struct KvLayout {
  int num_layers = 0;
  int num_kv_heads = 0;
  int head_dim = 0;
  int block_tokens = 16;
  DType dtype = DType::kF32;
  // FP8 only: values are stored as x / scale and read as q * scale, so
  // scale should be about max|x| / 448. Default 1 (vLLM's default too).
  float k_scale = 1.0f;
  float v_scale = 1.0f;

  size_t token_bytes() const {
    return static_cast<size_t>(num_kv_heads) * head_dim * DTypeSize(dtype);
  }
  // Bytes of one block: K and V of block_tokens positions of one layer.
  size_t block_bytes() const { return 2 * static_cast<size_t>(block_tokens) * token_bytes(); }
};

// Block table of one sequence.
struct SequenceKv {
  std::vector<std::vector<memory::BlockId>> blocks;  // [layer][logical block]
  int capacity_tokens(int block_tokens) const {
    return blocks.empty() ? 0 : static_cast<int>(blocks[0].size()) * block_tokens;
  }
  int64_t num_blocks() const {
    int64_t n = 0;
    for (const auto& l : blocks) n += static_cast<int64_t>(l.size());
    return n;
  }
};

class KvCache {
 public:
  // `allocator` must outlive the cache and hand out blocks of at least
  // layout.block_bytes() bytes.
  KvCache(const KvLayout& layout, memory::BlockAllocator* allocator);

  const KvLayout& layout() const { return layout_; }
  memory::BlockAllocator* allocator() const { return allocator_; }

  // Blocks that Reserve(seq, tokens) would allocate.
  int BlocksNeeded(const SequenceKv& seq, int tokens) const;
  // Grows `seq` so every layer covers `tokens` positions (layers may start
  // shorter than others: a session whose later layers were shed). All or
  // nothing: on RESOURCE_EXHAUSTED `seq` is unchanged.
  absl::Status Reserve(SequenceKv* seq, int tokens);
  // Frees all blocks of `seq` and clears it. Should the allocator refuse a
  // layer's blocks (BlockAllocator::Free: a double or foreign free, which
  // is a bug in whoever built the table), the refusal is logged with spdlog
  // and counted in release_errors(), the other layers are still freed, and
  // the table is cleared all the same: the caller carries on, since the
  // refused blocks were not this table's to free.
  void Release(SequenceKv* seq);
  // Frees every layer's blocks past those covering positions [0, tokens);
  // returns the blocks freed (refusals as Release).
  int64_t Truncate(SequenceKv* seq, int tokens);
  // Frees the blocks of layers [first_layer, num_layers) of `seq`, leaving
  // those layers empty; returns the blocks freed (refusals as Release).
  int64_t ReleaseLayers(SequenceKv* seq, int first_layer);
  // Release calls whose blocks the allocator refused, over the cache's life.
  int64_t release_errors() const { return release_errors_.load(std::memory_order_relaxed); }

  // Stores K and V ([kv_heads * head_dim] floats each) of position `pos`.
  void Write(const SequenceKv& seq, int layer, int pos, const float* k, const float* v);
  // Loads K or V of position `pos`, head `head` ([head_dim] floats).
  void ReadK(const SequenceKv& seq, int layer, int pos, int head, float* out) const;
  void ReadV(const SequenceKv& seq, int layer, int pos, int head, float* out) const;

 private:
  // Frees `ids` (layer `layer`'s blocks, for the log); the blocks freed,
  // 0 if the allocator refused them (counted in release_errors_).
  int64_t FreeBlocks(size_t layer, const std::vector<memory::BlockId>& ids);
  uint8_t* Slot(const SequenceKv& seq, int layer, int pos, bool value) const;

  KvLayout layout_;
  memory::BlockAllocator* allocator_;
  std::atomic<int64_t> release_errors_{0};
};

}  // namespace ballast::engine
