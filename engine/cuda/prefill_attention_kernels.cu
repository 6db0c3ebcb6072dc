// Causal paged attention for prefill chunks on tensor cores (WMMA, BF16/
// FP16 in, FP32 accumulate), flash-attention style: a block takes a tile of
// up to 64 consecutive queries of one chunk and one query head, and walks
// the sequence's KV in tiles of 64 keys with an online softmax. K/V tiles
// are gathered from their paged blocks (and FP8 dequantised) into shared
// memory. Each of the 4 warps owns 16 query rows: S = Q K^T, softmax, and
// O += P V for its rows, so only K/V loads need block-wide barriers.
#include <mma.h>

#include "engine/cuda/common.cuh"

namespace ballast::engine::cuda {
namespace {

using namespace nvcuda;

constexpr int kRowsPerTile = 64;   // queries per block
constexpr int kKeysPerTile = 64;   // keys per KV tile
constexpr int kWarps = 4;
constexpr int kThreads = kWarps * 32;

template <int D>
struct Smem {
  static constexpr int kQkLd = D + 8;              // bf16 elements per Q/K/V row
  static constexpr int kSLd = kKeysPerTile + 4;    // floats per S row
  static constexpr int kPLd = kKeysPerTile + 8;    // bf16 elements per P row
  static constexpr int kOLd = D + 4;               // floats per O row
  static constexpr size_t Align(size_t x) { return (x + 127) / 128 * 128; }
  static constexpr size_t kQ = 0;
  static constexpr size_t kK = Align(kQ + kRowsPerTile * kQkLd * 2);
  static constexpr size_t kV = Align(kK + kKeysPerTile * kQkLd * 2);
  static constexpr size_t kS = Align(kV + kKeysPerTile * kQkLd * 2);
  static constexpr size_t kP = Align(kS + kRowsPerTile * kSLd * 4);
  static constexpr size_t kO = Align(kP + kRowsPerTile * kPLd * 2);
  static constexpr size_t kStats = Align(kO + kRowsPerTile * kOLd * 4);
  static constexpr size_t kBytes = kStats + 3 * kRowsPerTile * 4;
};

template <typename T, typename KvT, int D>
__global__ void __launch_bounds__(kThreads)
    PrefillAttentionKernel(const T* __restrict__ q, const PrefillTile* __restrict__ tiles,
                           int num_heads, PagedKv kv, float scale, T* __restrict__ out) {
  using S = Smem<D>;
  extern __shared__ __align__(128) uint8_t smem[];
  T* Qs = reinterpret_cast<T*>(smem + S::kQ);
  T* Ks = reinterpret_cast<T*>(smem + S::kK);
  T* Vs = reinterpret_cast<T*>(smem + S::kV);
  float* Ss = reinterpret_cast<float*>(smem + S::kS);
  T* Ps = reinterpret_cast<T*>(smem + S::kP);
  float* Os = reinterpret_cast<float*>(smem + S::kO);
  float* m_s = reinterpret_cast<float*>(smem + S::kStats);
  float* l_s = m_s + kRowsPerTile;
  float* a_s = l_s + kRowsPerTile;

  const PrefillTile tile = tiles[blockIdx.x];
  const int h = blockIdx.y;
  const int kvh = h / (num_heads / kv.num_kv_heads);
  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
  constexpr int kGroups = D / 8;  // 8-element groups per row

  // Q tile, zero rows past the chunk; O, m, l reset.
  for (int i = tid; i < kRowsPerTile * kGroups; i += kThreads) {
    const int r = i / kGroups, c = (i % kGroups) * 8;
    uint4 v = make_uint4(0, 0, 0, 0);
    if (r < tile.n) {
      v = *reinterpret_cast<const uint4*>(q + (static_cast<size_t>(tile.first_token + r) * num_heads + h) * D + c);
    }
    *reinterpret_cast<uint4*>(Qs + r * S::kQkLd + c) = v;
  }
  for (int i = tid; i < kRowsPerTile * D; i += kThreads) Os[(i / D) * S::kOLd + i % D] = 0.0f;
  if (tid < kRowsPerTile) {
    m_s[tid] = -INFINITY;
    l_s[tid] = 0.0f;
  }
  const int kv_len = tile.pos0 + tile.n;  // keys the last query sees
  const int row0 = warp * 16;             // this warp's query rows

  for (int k0 = 0; k0 < kv_len; k0 += kKeysPerTile) {
    __syncthreads();  // previous tile's K/V fully consumed
    for (int i = tid; i < kKeysPerTile * kGroups; i += kThreads) {
      const int r = i / kGroups, c = (i % kGroups) * 8;
      const int key = k0 + r;
      float kf[8], vf[8];
      if (key < kv_len) {
        Load8(reinterpret_cast<const KvT*>(KvSlot(kv, tile.seq, key, kvh, false, sizeof(KvT))) + c, kf);
        Load8(reinterpret_cast<const KvT*>(KvSlot(kv, tile.seq, key, kvh, true, sizeof(KvT))) + c, vf);
      } else {
#pragma unroll
        for (int j = 0; j < 8; ++j) kf[j] = vf[j] = 0.0f;
      }
#pragma unroll
      for (int j = 0; j < 8; ++j) {
        Ks[r * S::kQkLd + c + j] = FromF<T>(kf[j] * kv.k_scale);
        Vs[r * S::kQkLd + c + j] = FromF<T>(vf[j] * kv.v_scale);
      }
    }
    __syncthreads();

    // S[row0:row0+16][0:64] = Q K^T.
    {
      wmma::fragment<wmma::accumulator, 16, 16, 16, float> acc[kKeysPerTile / 16];
#pragma unroll
      for (int n = 0; n < kKeysPerTile / 16; ++n) wmma::fill_fragment(acc[n], 0.0f);
#pragma unroll
      for (int kk = 0; kk < D; kk += 16) {
        wmma::fragment<wmma::matrix_a, 16, 16, 16, T, wmma::row_major> a;
        wmma::load_matrix_sync(a, Qs + row0 * S::kQkLd + kk, S::kQkLd);
#pragma unroll
        for (int n = 0; n < kKeysPerTile / 16; ++n) {
          wmma::fragment<wmma::matrix_b, 16, 16, 16, T, wmma::col_major> b;
          wmma::load_matrix_sync(b, Ks + (n * 16) * S::kQkLd + kk, S::kQkLd);
          wmma::mma_sync(acc[n], a, b, acc[n]);
        }
      }
#pragma unroll
      for (int n = 0; n < kKeysPerTile / 16; ++n) {
        wmma::store_matrix_sync(Ss + row0 * S::kSLd + n * 16, acc[n], S::kSLd, wmma::mem_row_major);
      }
    }
    __syncwarp();
    // Online softmax over this warp's 16 rows; lanes take keys lane, lane + 32.
    for (int rr = 0; rr < 16; ++rr) {
      const int r = row0 + rr;
      const int qpos = tile.pos0 + r;  // causal limit of this query
      float s0 = -INFINITY, s1 = -INFINITY;
      if (r < tile.n) {
        if (k0 + lane <= qpos) s0 = Ss[r * S::kSLd + lane] * scale;
        if (k0 + lane + 32 <= qpos) s1 = Ss[r * S::kSLd + lane + 32] * scale;
      }
      const float mx = WarpMax(fmaxf(s0, s1));
      const float m_old = m_s[r];
      const float m_new = fmaxf(m_old, mx);
      float p0 = 0.0f, p1 = 0.0f, alpha = 1.0f;
      if (m_new != -INFINITY) {
        p0 = expf(s0 - m_new);
        p1 = expf(s1 - m_new);
        alpha = expf(m_old - m_new);
      }
      Ps[r * S::kPLd + lane] = FromF<T>(p0);
      Ps[r * S::kPLd + lane + 32] = FromF<T>(p1);
      const float sum = WarpSum(p0 + p1);
      __syncwarp();
      if (lane == 0) {
        a_s[r] = alpha;
        l_s[r] = l_s[r] * alpha + sum;
        m_s[r] = m_new;
      }
    }
    __syncwarp();
    // Rescale this warp's O rows, then O += P V.
    for (int i = lane; i < 16 * D; i += 32) {
      const int r = row0 + i / D;
      Os[r * S::kOLd + i % D] *= a_s[r];
    }
    __syncwarp();
#pragma unroll
    for (int n = 0; n < D / 16; ++n) {
      wmma::fragment<wmma::accumulator, 16, 16, 16, float> o;
      wmma::load_matrix_sync(o, Os + row0 * S::kOLd + n * 16, S::kOLd, wmma::mem_row_major);
#pragma unroll
      for (int kk = 0; kk < kKeysPerTile; kk += 16) {
        wmma::fragment<wmma::matrix_a, 16, 16, 16, T, wmma::row_major> a;
        wmma::fragment<wmma::matrix_b, 16, 16, 16, T, wmma::row_major> b;
        wmma::load_matrix_sync(a, Ps + row0 * S::kPLd + kk, S::kPLd);
        wmma::load_matrix_sync(b, Vs + kk * S::kQkLd + n * 16, S::kQkLd);
        wmma::mma_sync(o, a, b, o);
      }
      wmma::store_matrix_sync(Os + row0 * S::kOLd + n * 16, o, S::kOLd, wmma::mem_row_major);
    }
  }
  __syncwarp();
  for (int i = lane; i < 16 * D; i += 32) {
    const int r = row0 + i / D, d = i % D;
    if (r < tile.n) {
      out[(static_cast<size_t>(tile.first_token + r) * num_heads + h) * D + d] =
          FromF<T>(Os[r * S::kOLd + d] / l_s[r]);
    }
  }
}

template <typename T, typename KvT, int D>
cudaError_t Launch(const T* q, const PrefillTile* tiles, int num_tiles, int num_heads,
                   const PagedKv& kv, float scale, T* out, cudaStream_t stream) {
  constexpr size_t bytes = Smem<D>::kBytes;
  auto* kernel = &PrefillAttentionKernel<T, KvT, D>;
  cudaError_t e = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                       static_cast<int>(bytes));
  if (e != cudaSuccess) return e;
  kernel<<<dim3(num_tiles, num_heads), kThreads, bytes, stream>>>(q, tiles, num_heads, kv, scale, out);
  return cudaGetLastError();
}

template <typename T, typename KvT>
cudaError_t LaunchForDim(const T* q, const PrefillTile* tiles, int num_tiles, int num_heads,
                         const PagedKv& kv, float scale, T* out, cudaStream_t stream) {
  switch (kv.head_dim) {
    case 64: return Launch<T, KvT, 64>(q, tiles, num_tiles, num_heads, kv, scale, out, stream);
    case 128: return Launch<T, KvT, 128>(q, tiles, num_tiles, num_heads, kv, scale, out, stream);
    default: return cudaErrorInvalidValue;
  }
}

}  // namespace

bool PrefillAttentionSupports(int head_dim) { return head_dim == 64 || head_dim == 128; }

cudaError_t LaunchPrefillAttention(const void* q, const PrefillTile* tiles, int num_tiles,
                                   int num_heads, PagedKv kv, float scale, void* out,
                                   ActType type, cudaStream_t stream) {
  if (num_tiles == 0) return cudaSuccess;
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
