// The stream plan's side of the decode attention (engine/attention_plan.h):
// where a block's run of chunks lies among the launch's (token, KV head,
// head group) units, and how a unit cut between blocks is written in
// pieces and merged. The chunks of every unit are laid end to end in the
// launch's token order (TokenMap::order); block b of C attends chunks
// [b N / C, (b + 1) N / C) of the N, unit by unit. A run within one unit
// is a segment: a whole unit is written to the output by its block; a cut
// one leaves a piece in the workspace, and the last of its blocks to
// finish merges the pieces in block order. Each block writes at most two
// pieces: its first segment's, when it starts inside a unit (piece
// C + b), and its last segment's, when that starts a unit and ends inside
// it (piece b); so a unit's pieces are b_first, then C + b for the later
// blocks that hold it. Included by .cu files only; device functions act
// on the calling block alone.
#pragma once

#include "engine/cuda/paged_attention.cuh"

namespace ballast::engine::cuda {

static_assert(sizeof(AttentionStreamStart) == 16, "read as an int4");

// AttentionStreamBlockOf (engine/attention_plan.h) in device code: the
// block that holds chunk j of `total` shared among `ctas`.
__device__ __forceinline__ int StreamBlockOf(int64_t j, int64_t total, int ctas) {
  return static_cast<int>(((j + 1) * ctas - 1) / total);
}

// Whether block b of `ctas` holds any of `total` chunks: every block does
// when total >= ctas (the plans PlanPagedAttention makes); with fewer
// chunks some hold none, write no piece and are not counted.
__device__ __forceinline__ bool StreamBlockHolds(int b, int64_t total, int ctas) {
  return b * total / ctas < (b + 1) * total / ctas;
}

// The blocks that hold chunks among [first_block, last_block].
__device__ __forceinline__ int StreamBlocksHolding(int first_block, int last_block, int64_t total,
                                                   int ctas) {
  if (total >= ctas) return last_block - first_block + 1;
  int n = 0;
  for (int b = first_block; b <= last_block; ++b) n += StreamBlockHolds(b, total, ctas);
  return n;
}

// A block's walk over the units its chunks lie in, from the
// AttentionStreamStart the host wrote for it. Every thread walks alike.
class StreamCursor {
 public:
  // G: query heads a block (kAttentionMaxGroup at most).
  __device__ StreamCursor(const TokenMap& tokens, int num_heads, const PagedKv& kv, int G,
                          const AttentionStreamStart& start)
      : tokens_(tokens),
        group_(num_heads / kv.num_kv_heads),
        groups_per_kvh_((group_ + G - 1) / G),
        units_per_token_(kv.num_kv_heads * groups_per_kvh_),
        G_(G),
        slot_(start.slot),
        slot_chunk_(start.slot_chunk) {
    Load();
  }

  // The segment that starts at chunk j (in this block's range, which ends
  // at j_end; j is at or past the current slot's first chunk) as a task
  // with its unit's first chunk and length; *seg_end: its end.
  __device__ void Segment(int64_t j, int64_t j_end, PagedBlockTask* w, int64_t* unit_first,
                          int* unit_chunks, int64_t* seg_end) {
    while (j >= slot_chunk_ + static_cast<int64_t>(units_per_token_) * chunks_) {
      slot_chunk_ += static_cast<int64_t>(units_per_token_) * chunks_;
      ++slot_;
      Load();
    }
    const int unit = static_cast<int>((j - slot_chunk_) / chunks_);
    const int64_t first = slot_chunk_ + static_cast<int64_t>(unit) * chunks_;
    const int64_t end = min(j_end, first + chunks_);
    w->slot = slot_;
    w->t = t_;
    w->seq = seq_;
    w->kvh = unit / groups_per_kvh_;
    const int g0 = (unit % groups_per_kvh_) * G_;
    w->ng = min(G_, group_ - g0);
    w->head0 = w->kvh * group_ + g0;
    w->start = static_cast<int>(j - first) * kAttentionStreamChunk;
    w->end = min(static_cast<int>(end - first) * kAttentionStreamChunk, pos_ + 1);
    w->direct = j == first && end == first + chunks_;
    *unit_first = first;
    *unit_chunks = chunks_;
    *seg_end = end;
  }

 private:
  // The current slot's token, position and chunks a unit (0 for a token
  // the launch skips: the walk passes it).
  __device__ void Load() {
    t_ = tokens_.order != nullptr ? tokens_.order[slot_] : slot_;
    pos_ = tokens_.pos[t_];
    seq_ = pos_ >= 0 ? tokens_.seq[t_] : 0;
    chunks_ = pos_ >= 0 ? (pos_ + kAttentionStreamChunk) / kAttentionStreamChunk : 0;
  }

  const TokenMap& tokens_;
  const int group_, groups_per_kvh_, units_per_token_, G_;
  int slot_;
  int64_t slot_chunk_;
  int t_ = 0, pos_ = -1, seq_ = 0, chunks_ = 0;
};

// The workspace's pieces (PagedAttentionWorkspaceBytes of a stream plan):
// piece p holds G heads: o [G][D] (unnormalised, times v_scale), then
// after every piece's o, m [G] and l [G] of every piece.
struct StreamPieces {
  float* o;
  float* m;
  float* l;
  __device__ StreamPieces(const PagedWorkspace& ws) : o(ws.o), m(ws.m), l(ws.l) {}
};

// The block's end for a cut unit's segment, after __syncthreads(): merges
// the warps' states (MergeWarpStates) into piece `piece`.
template <int G, int D>
__device__ __forceinline__ void MergeWarpsAndStorePiece(const uint8_t* smem, int warp_bytes,
                                                        const PagedBlockTask& w, float v_scale,
                                                        const StreamPieces& ws, int piece) {
  for (int i = threadIdx.x; i < w.ng * D; i += blockDim.x) {
    const int g = i / D, d = i % D;
    float m, l, o;
    MergeWarpStates<G, D>(smem, warp_bytes, g, d, &m, &l, &o);
    ws.o[(static_cast<size_t>(piece) * G + g) * D + d] = o * v_scale;
    if (d == 0) {
      ws.m[piece * G + g] = m;
      ws.l[piece * G + g] = l;
    }
  }
}

// The last block of a cut unit (ArriveLast): its heads' pieces (piece
// `first_block`, then ctas + b for the blocks b in (first_block,
// last_block] that hold chunks) merged in that order into out, a warp a
// head; reads past L1 (the pieces were written by other blocks of the
// launch).
template <typename T, int G>
__device__ __forceinline__ void MergeStreamPieces(const PagedBlockTask& w, int num_heads,
                                                  int head_dim, const StreamPieces& ws,
                                                  int first_block, int last_block, int64_t total,
                                                  int ctas, T* __restrict__ out) {
  constexpr int kMaxCols = 8;  // head_dim <= 256
  const int lane = static_cast<int>(threadIdx.x) % 32;
  const int warps = static_cast<int>(blockDim.x) / 32;
  for (int g = static_cast<int>(threadIdx.x) / 32; g < w.ng; g += warps) {
    auto piece = [&](int b) { return (b == first_block ? b : ctas + b) * G + g; };
    float mx = -INFINITY;
    for (int b = first_block; b <= last_block; ++b) {
      if (StreamBlockHolds(b, total, ctas)) mx = fmaxf(mx, __ldcg(ws.m + piece(b)));
    }
    float denom = 0.0f, num[kMaxCols];
#pragma unroll
    for (int j = 0; j < kMaxCols; ++j) num[j] = 0.0f;
    for (int b = first_block; b <= last_block; ++b) {
      if (!StreamBlockHolds(b, total, ctas)) continue;
      const int p = piece(b);
      const float m = __ldcg(ws.m + p);
      const float wgt = m == -INFINITY ? 0.0f : exp2f(m - mx);
      denom += wgt * __ldcg(ws.l + p);
      const float* o = ws.o + static_cast<size_t>(p) * head_dim;
#pragma unroll
      for (int j = 0; j < kMaxCols; ++j) {
        const int d = lane + 32 * j;
        if (d < head_dim) num[j] += wgt * __ldcg(o + d);
      }
    }
    T* row = out + (static_cast<size_t>(w.t) * num_heads + w.head0 + g) * head_dim;
#pragma unroll
    for (int j = 0; j < kMaxCols; ++j) {
      const int d = lane + 32 * j;
      if (d < head_dim) row[d] = FromF<T>(num[j] / denom);
    }
  }
}

}  // namespace ballast::engine::cuda
