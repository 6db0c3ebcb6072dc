// Causal paged attention for prefill chunks on tensor cores, FlashAttention-2
// style, written with mma.sync (m16n8k16, BF16/FP16 in, FP32 accumulate) and
// ldmatrix, whose register layouts the PTX ISA defines:
// - a block takes a tile of up to 128 consecutive queries of one chunk and
//   one query head; each warp owns 32 query rows (two 16-row MMA tiles, so
//   each K/V fragment read from shared memory feeds four MMAs: shared
//   memory bandwidth, not the tensor cores, bounded the one-tile form), or
//   16 rows for head size 256, whose accumulators would not fit twice;
// - the sequence's KV is walked in tiles of 64 keys, gathered from their
//   paged blocks into shared memory with cp.async, one tile ahead of the
//   math (FP8 caches are dequantised on the way, synchronously);
// - S = Q K^T, the online softmax (base 2, one FMA and one ex2 per score)
//   and O += P V stay in registers; Q is read from shared memory; the
//   causal mask is applied only on tiles that cross a warp's diagonal; row
//   sums are kept per lane and reduced once at the end;
// - blocks are ordered longest tile first (the last tile of a chunk sees
//   the most keys), with the heads of one tile adjacent so that a GQA
//   group's K/V tiles are read from L2 together.
#include <cuda_pipeline.h>

#include <atomic>
#include <type_traits>

#include "engine/cuda/common.cuh"
#include "engine/cuda/mma.cuh"

namespace ballast::engine::cuda {
namespace {

constexpr int kRowsPerTile = kPrefillTileTokens;  // queries per block
constexpr int kKeysPerTile = 64;                  // keys per KV tile
constexpr float kLog2e = 1.4426950408889634f;

// Per head size D: kM 16-row MMA tiles per warp, kWarps warps a block.
// Shared memory: two K/V buffers (double buffering), the Q tile, and each
// buffer's key row offsets. Rows are padded by 16 bytes, so the 8 rows an
// ldmatrix reads fall in 8 different 16-byte bank groups for every head
// size here.
template <int D>
struct Shape {
  static_assert(D % 16 == 0 && D <= 256, "head size");
  static constexpr int kM = D <= 128 ? 2 : 1;
  static constexpr int kWarps = kRowsPerTile / (16 * kM);
  static constexpr int kThreads = kWarps * 32;
  static constexpr int kLd = D + 8;  // elements per Q/K/V row
  static constexpr size_t kTile = kKeysPerTile * kLd * 2;
  __host__ __device__ static constexpr size_t K(int buf) { return buf * 2 * kTile; }
  __host__ __device__ static constexpr size_t V(int buf) { return buf * 2 * kTile + kTile; }
  static constexpr size_t kQ = 4 * kTile;
  static constexpr size_t kRows = kQ + kRowsPerTile * kLd * 2;  // [2][kKeysPerTile] size_t
  static constexpr size_t kBytes = kRows + 2 * kKeysPerTile * sizeof(size_t);
};

// One lane's share of a warp's query rows: rows g and g + 8 of each of the
// warp's kM 16-row tiles.
template <int kM>
struct RowState {
  float m[kM][2];  // running max of the scaled (log2) scores
  float l[kM][2];  // this lane's partial row sums
  __device__ RowState() {
#pragma unroll
    for (int a = 0; a < kM; ++a) m[a][0] = m[a][1] = -INFINITY, l[a][0] = l[a][1] = 0.0f;
  }
};

// S (kM x 16 rows x 64 keys, n-tiles of 8 keys) = Q K^T for one warp; qs:
// the warp's first Q row, ks: the K tile.
template <typename T, int D>
__device__ __forceinline__ void ScoreTile(const T* qs, const T* ks, int lane,
                                          float s[Shape<D>::kM][kKeysPerTile / 8][4]) {
  constexpr int kLd = Shape<D>::kLd, kM = Shape<D>::kM;
#pragma unroll
  for (int a = 0; a < kM; ++a) {
#pragma unroll
    for (int j = 0; j < kKeysPerTile / 8; ++j)
      s[a][j][0] = s[a][j][1] = s[a][j][2] = s[a][j][3] = 0;
  }
#pragma unroll
  for (int kk = 0; kk < D / 16; ++kk) {
    uint32_t qa[kM][4];
#pragma unroll
    for (int a = 0; a < kM; ++a)
      Ldsm4(SmemAddr(qs + (16 * a + (lane & 15)) * kLd + kk * 16 + 8 * (lane >> 4)), qa[a]);
#pragma unroll
    for (int np = 0; np < kKeysPerTile / 16; ++np) {
      // Keys 16 np + 0..15: matrices (keys 0-7, d 0-7), (0-7, 8-15),
      // (8-15, 0-7), (8-15, 8-15) give b0, b1 of n-tiles 2 np and 2 np + 1.
      uint32_t b[4];
      Ldsm4(SmemAddr(ks + (16 * np + (lane & 7) + 8 * (lane >> 4)) * kLd + kk * 16 +
                     8 * ((lane >> 3) & 1)),
            b);
#pragma unroll
      for (int a = 0; a < kM; ++a) {
        Mma<T>(s[a][2 * np], qa[a], b[0], b[1]);
        Mma<T>(s[a][2 * np + 1], qa[a], b[2], b[3]);
      }
    }
  }
}

// Online softmax over one tile of scores (raw dot products; c = scale in
// log2 units > 0): updates the row state, rescales O by alpha and returns
// P (rounded to T) as A fragments, keys 16 kk + 0..15.
template <typename T, int D>
__device__ __forceinline__ void Softmax(float s[Shape<D>::kM][kKeysPerTile / 8][4], float c,
                                        RowState<Shape<D>::kM>& st, float o[][D / 8][4],
                                        uint32_t p[][kKeysPerTile / 16][4]) {
  constexpr int kM = Shape<D>::kM;
#pragma unroll
  for (int a = 0; a < kM; ++a) {
    float mx[2] = {-INFINITY, -INFINITY};
#pragma unroll
    for (int j = 0; j < kKeysPerTile / 8; ++j) {
      mx[0] = fmaxf(mx[0], fmaxf(s[a][j][0], s[a][j][1]));
      mx[1] = fmaxf(mx[1], fmaxf(s[a][j][2], s[a][j][3]));
    }
    float alpha[2], mc[2];
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xffffffffu, mx[r], 1));
      mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xffffffffu, mx[r], 2));
      const float mn = fmaxf(st.m[a][r], mx[r] * c);
      mc[r] = mn == -INFINITY ? 0.0f : mn;  // a row with no key yet: p = 0
      alpha[r] = Exp2(st.m[a][r] - mc[r]);
      st.m[a][r] = mn;
      st.l[a][r] *= alpha[r];
    }
#pragma unroll
    for (int j = 0; j < kKeysPerTile / 8; ++j) {
      const float p0 = Exp2(fmaf(s[a][j][0], c, -mc[0])), p1 = Exp2(fmaf(s[a][j][1], c, -mc[0]));
      const float p2 = Exp2(fmaf(s[a][j][2], c, -mc[1])), p3 = Exp2(fmaf(s[a][j][3], c, -mc[1]));
      st.l[a][0] += p0 + p1;
      st.l[a][1] += p2 + p3;
      p[a][j / 2][(j & 1) * 2] = Pack2<T>(p0, p1);
      p[a][j / 2][(j & 1) * 2 + 1] = Pack2<T>(p2, p3);
    }
#pragma unroll
    for (int n = 0; n < D / 8; ++n) {
      o[a][n][0] *= alpha[0];
      o[a][n][1] *= alpha[0];
      o[a][n][2] *= alpha[1];
      o[a][n][3] *= alpha[1];
    }
  }
}

// O += P V for one warp; vs: the V tile.
template <typename T, int D>
__device__ __forceinline__ void AccumulatePv(const uint32_t p[][kKeysPerTile / 16][4], const T* vs,
                                             int lane, float o[][D / 8][4]) {
  constexpr int kLd = Shape<D>::kLd, kM = Shape<D>::kM;
#pragma unroll
  for (int kk = 0; kk < kKeysPerTile / 16; ++kk) {
#pragma unroll
    for (int dp = 0; dp < D / 16; ++dp) {
      // Transposed: (keys 0-7, d 0-7), (8-15, 0-7), (0-7, 8-15), (8-15,
      // 8-15) give b0, b1 of d-tiles 2 dp and 2 dp + 1.
      uint32_t b[4];
      Ldsm4T(SmemAddr(vs + (16 * kk + (lane & 7) + 8 * ((lane >> 3) & 1)) * kLd + 16 * dp +
                      8 * (lane >> 4)),
             b);
#pragma unroll
      for (int a = 0; a < kM; ++a) {
        Mma<T>(o[a][2 * dp], p[a][kk], b[0], b[1]);
        Mma<T>(o[a][2 * dp + 1], p[a][kk], b[2], b[3]);
      }
    }
  }
}

// Byte offsets from kv.base of the K rows of keys k0 .. k0 + 63 (past the
// last key: the last key's, whose copy is zero-filled), one per thread.
template <typename KvT>
__device__ __forceinline__ void KeyRows(const PagedKv& kv, const PrefillTile& tile, int kvh, int k0,
                                        int kv_len, size_t* rows) {
  const int r = threadIdx.x;
  if (r < kKeysPerTile) {
    const int key = min(k0 + r, kv_len - 1);
    rows[r] = static_cast<size_t>(KvSlot(kv, tile.seq, key, kvh, false, sizeof(KvT)) - kv.base);
  }
}

// Fetches KV tile k0 (key rows from `rows`) into K/V tiles ks, vs: 16-byte
// cp.async copies (zero fill past kv_len) when the cache holds T, else a
// synchronous FP8 dequantising load. FP8 scales are applied to S and O.
template <typename T, typename KvT, int D>
__device__ __forceinline__ void FetchKv(const PagedKv& kv, const size_t* rows, int k0, int kv_len,
                                        T* ks, T* vs) {
  constexpr int kGroups = D / 8;  // 8-element groups per row
  constexpr int kLd = Shape<D>::kLd;
  const size_t v_off = static_cast<size_t>(kv.block_tokens) * kv.num_kv_heads * D * sizeof(KvT);
  for (int i = threadIdx.x; i < kKeysPerTile * kGroups; i += Shape<D>::kThreads) {
    const int r = i / kGroups, c = (i % kGroups) * 8;
    const bool valid = k0 + r < kv_len;
    const KvT* kp = reinterpret_cast<const KvT*>(kv.base + rows[r]) + c;
    const KvT* vp = reinterpret_cast<const KvT*>(kv.base + rows[r] + v_off) + c;
    if constexpr (std::is_same_v<KvT, T>) {
      __pipeline_memcpy_async(ks + r * kLd + c, kp, 16, valid ? 0 : 16);
      __pipeline_memcpy_async(vs + r * kLd + c, vp, 16, valid ? 0 : 16);
    } else {
      float kf[8], vf[8];
      Load8(kp, kf);
      Load8(vp, vf);
      uint4 kr, vr;
      uint32_t* kw = reinterpret_cast<uint32_t*>(&kr);
      uint32_t* vw = reinterpret_cast<uint32_t*>(&vr);
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        kw[j] = valid ? Pack2<T>(kf[2 * j], kf[2 * j + 1]) : 0u;
        vw[j] = valid ? Pack2<T>(vf[2 * j], vf[2 * j + 1]) : 0u;
      }
      *reinterpret_cast<uint4*>(ks + r * kLd + c) = kr;
      *reinterpret_cast<uint4*>(vs + r * kLd + c) = vr;
    }
  }
  __pipeline_commit();
}

// Copies the tile's Q rows (zeros past tile.n) into qs.
template <typename T, int D>
__device__ __forceinline__ void StageQ(const T* q, const PrefillTile& tile, int num_heads, int h,
                                       T* qs) {
  constexpr int kGroups = D / 8;
  for (int i = threadIdx.x; i < kRowsPerTile * kGroups; i += Shape<D>::kThreads) {
    const int r = i / kGroups, c = (i % kGroups) * 8;
    uint4 v = make_uint4(0, 0, 0, 0);
    if (r < tile.n) {
      v = *reinterpret_cast<const uint4*>(
          q + (static_cast<size_t>(tile.first_token + r) * num_heads + h) * D + c);
    }
    *reinterpret_cast<uint4*>(qs + r * Shape<D>::kLd + c) = v;
  }
}

// Masks scores of keys past each row's position; qpos[a][r]: the position
// of the lane's row g + 8 r of 16-row tile a.
template <int kM>
__device__ __forceinline__ void CausalMask(float s[kM][kKeysPerTile / 8][4], int k0, int lane,
                                           const int qpos[kM][2]) {
#pragma unroll
  for (int a = 0; a < kM; ++a) {
#pragma unroll
    for (int j = 0; j < kKeysPerTile / 8; ++j) {
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        const int key = k0 + 8 * j + 2 * (lane & 3) + (i & 1);
        if (key > qpos[a][i >> 1]) s[a][j][i] = -INFINITY;
      }
    }
  }
}

// out rows of the warp (from row0) = O / l (* v_scale), as packed pairs.
template <typename T, int D>
__device__ __forceinline__ void WriteOut(float o[][D / 8][4], RowState<Shape<D>::kM>& st,
                                         float v_scale, const PrefillTile& tile, int row0,
                                         int num_heads, int h, int lane, T* out) {
#pragma unroll
  for (int a = 0; a < Shape<D>::kM; ++a) {
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      float l = st.l[a][r];
      l += __shfl_xor_sync(0xffffffffu, l, 1);
      l += __shfl_xor_sync(0xffffffffu, l, 2);
      const int row = row0 + 16 * a + (lane >> 2) + 8 * r;
      if (row >= tile.n) continue;
      const float f = v_scale / l;
      T* dst =
          out + (static_cast<size_t>(tile.first_token + row) * num_heads + h) * D + 2 * (lane & 3);
#pragma unroll
      for (int n = 0; n < D / 8; ++n) {
        *reinterpret_cast<uint32_t*>(dst + 8 * n) =
            Pack2<T>(o[a][n][2 * r] * f, o[a][n][2 * r + 1] * f);
      }
    }
  }
}

template <typename T, typename KvT, int D>
__global__ void __launch_bounds__(Shape<D>::kThreads)
    PrefillAttentionKernel(const T* __restrict__ q, const PrefillTile* __restrict__ tiles,
                           int num_heads, PagedKv kv, float scale, T* __restrict__ out) {
  using S = Shape<D>;
  constexpr int kM = S::kM;
  extern __shared__ __align__(128) uint8_t smem[];
  T* qs = reinterpret_cast<T*>(smem + S::kQ);
  size_t* rows = reinterpret_cast<size_t*>(smem + S::kRows);  // [2][kKeysPerTile]
  AllowNextGrid();
  WaitPriorGrid();

  const PrefillTile tile = tiles[gridDim.y - 1 - blockIdx.y];  // longest first
  const int h = blockIdx.x;
  const int kvh = h / (num_heads / kv.num_kv_heads);
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int kv_len = tile.pos0 + tile.n;  // keys the last query sees
  const int num_kv_tiles = (kv_len + kKeysPerTile - 1) / kKeysPerTile;

  StageQ<T, D>(q, tile, num_heads, h, qs);
  KeyRows<KvT>(kv, tile, kvh, 0, kv_len, rows);
  if (num_kv_tiles > 1) KeyRows<KvT>(kv, tile, kvh, kKeysPerTile, kv_len, rows + kKeysPerTile);
  __syncthreads();
  const int row0 = warp * 16 * kM;  // this warp's query rows
  float o[kM][D / 8][4];
#pragma unroll
  for (int a = 0; a < kM; ++a) {
#pragma unroll
    for (int n = 0; n < D / 8; ++n) o[a][n][0] = o[a][n][1] = o[a][n][2] = o[a][n][3] = 0.0f;
  }
  RowState<kM> st;
  // Rows past the chunk compute as the chunk's last row and are not written.
  const int last = tile.n - 1;
  int qpos[kM][2];
#pragma unroll
  for (int a = 0; a < kM; ++a) {
    qpos[a][0] = tile.pos0 + min(row0 + 16 * a + (lane >> 2), last);
    qpos[a][1] = tile.pos0 + min(row0 + 16 * a + (lane >> 2) + 8, last);
  }
  const int warp_first = tile.pos0 + row0;
  const int warp_last = tile.pos0 + min(row0 + 16 * kM - 1, last);
  const float c = scale * kv.k_scale * kLog2e;

  FetchKv<T, KvT, D>(kv, rows, 0, kv_len, reinterpret_cast<T*>(smem + S::K(0)),
                     reinterpret_cast<T*>(smem + S::V(0)));
  for (int it = 0; it < num_kv_tiles; ++it) {
    const int buf = it & 1, k0 = it * kKeysPerTile;
    if (it + 1 < num_kv_tiles) {  // overlaps this tile's math
      FetchKv<T, KvT, D>(kv, rows + (buf ^ 1) * kKeysPerTile, k0 + kKeysPerTile, kv_len,
                         reinterpret_cast<T*>(smem + S::K(buf ^ 1)),
                         reinterpret_cast<T*>(smem + S::V(buf ^ 1)));
      __pipeline_wait_prior(1);
    } else {
      __pipeline_wait_prior(0);
    }
    __syncthreads();
    // This buffer's rows were used by the previous iteration's fetch: reuse
    // them for the tile after next.
    if (it + 2 < num_kv_tiles)
      KeyRows<KvT>(kv, tile, kvh, k0 + 2 * kKeysPerTile, kv_len, rows + buf * kKeysPerTile);
    // Warps past the chunk, and tiles past a warp's last row, add nothing.
    if (row0 < tile.n && k0 <= warp_last) {
      float s[kM][kKeysPerTile / 8][4];
      ScoreTile<T, D>(qs + row0 * S::kLd, reinterpret_cast<const T*>(smem + S::K(buf)), lane, s);
      if (k0 + kKeysPerTile - 1 > warp_first) CausalMask<kM>(s, k0, lane, qpos);
      uint32_t p[kM][kKeysPerTile / 16][4];
      Softmax<T, D>(s, c, st, o, p);
      AccumulatePv<T, D>(p, reinterpret_cast<const T*>(smem + S::V(buf)), lane, o);
    }
    __syncthreads();  // this buffer is refilled by the next iteration's fetch
  }
  WriteOut<T, D>(o, st, kv.v_scale, tile, row0, num_heads, h, lane, out);
}

template <typename T, typename KvT, int D>
cudaError_t Launch(const T* q, const PrefillTile* tiles, int num_tiles, int num_heads,
                   const PagedKv& kv, float scale, T* out, cudaStream_t stream) {
  constexpr size_t bytes = Shape<D>::kBytes;
  auto* kernel = &PrefillAttentionKernel<T, KvT, D>;
  static std::atomic<uint64_t> smem_set{0};  // per device (SetMaxDynamicSmemOnce)
  const cudaError_t e = SetMaxDynamicSmemOnce(kernel, static_cast<int>(bytes), &smem_set);
  if (e != cudaSuccess) return e;
  return LaunchKernel(kernel, dim3(num_heads, num_tiles), Shape<D>::kThreads, bytes, stream, q,
                      tiles, num_heads, kv, scale, out);
}

template <typename T, typename KvT>
cudaError_t LaunchForDim(const T* q, const PrefillTile* tiles, int num_tiles, int num_heads,
                         const PagedKv& kv, float scale, T* out, cudaStream_t stream) {
  switch (kv.head_dim) {
    case 64:
      return Launch<T, KvT, 64>(q, tiles, num_tiles, num_heads, kv, scale, out, stream);
    case 80:
      return Launch<T, KvT, 80>(q, tiles, num_tiles, num_heads, kv, scale, out, stream);
    case 96:
      return Launch<T, KvT, 96>(q, tiles, num_tiles, num_heads, kv, scale, out, stream);
    case 128:
      return Launch<T, KvT, 128>(q, tiles, num_tiles, num_heads, kv, scale, out, stream);
    case 256:
      return Launch<T, KvT, 256>(q, tiles, num_tiles, num_heads, kv, scale, out, stream);
    default:
      return cudaErrorInvalidValue;
  }
}

}  // namespace

bool PrefillAttentionSupports(int head_dim) {
  return head_dim == 64 || head_dim == 80 || head_dim == 96 || head_dim == 128 || head_dim == 256;
}

cudaError_t LaunchPrefillAttention(const void* q, const PrefillTile* tiles, int num_tiles,
                                   int num_heads, PagedKv kv, float scale, void* out, ActType type,
                                   cudaStream_t stream) {
  if (num_tiles == 0) return cudaSuccess;
  if (num_tiles > 65535) return cudaErrorInvalidValue;  // grid.y
  if (kv.num_kv_heads <= 0 || num_heads % kv.num_kv_heads != 0) return cudaErrorInvalidValue;
  BALLAST_DISPATCH_ACT(type, T, {
    const T* qt = static_cast<const T*>(q);
    T* o = static_cast<T*>(out);
    if (kv.dtype == KvType::kFP8E4M3) {
      return LaunchForDim<T, __nv_fp8_e4m3>(qt, tiles, num_tiles, num_heads, kv, scale, o, stream);
    }
    if ((kv.dtype == KvType::kBF16) != (type == ActType::kBF16)) return cudaErrorInvalidValue;
    return LaunchForDim<T, T>(qt, tiles, num_tiles, num_heads, kv, scale, o, stream);
  });
  return cudaErrorInvalidValue;
}

}  // namespace ballast::engine::cuda
