// Causal paged attention for prefill chunks on tensor cores (WMMA, BF16/
// FP16 in, FP32 accumulate), flash-attention style: a block takes a tile of
// up to 64 consecutive queries of one chunk and one query head, and walks
// the sequence's KV in tiles of 64 keys with an online softmax. K/V tiles
// are gathered from their paged blocks (and FP8 dequantised) into shared
// memory. Each of the 4 warps owns 16 query rows: S = Q K^T, softmax, and
// O += P V for its rows, so only K/V loads need block-wide barriers. Head
// sizes are multiples of 16; up to 128 the warp keeps its Q rows in
// registers, above (256) Q stays in shared memory, where the fragments of
// Q and O together would spill.
#include <cuda_pipeline.h>
#include <mma.h>

#include <type_traits>

#include "engine/cuda/common.cuh"

namespace ballast::engine::cuda {
namespace {

using namespace nvcuda;

constexpr int kRowsPerTile = 64;  // queries per block
constexpr int kKeysPerTile = 64;  // keys per KV tile
constexpr int kWarps = 4;
constexpr int kThreads = kWarps * 32;

// Element i of a lane's 16x16 accumulator (and, for 16-bit types, matrix_a)
// fragment on sm_80+: row g + 8 ((i / 2) % 2) (g = lane / 4), column
// 2 (lane % 4) + i % 2 + 8 (i / 4). WMMA does not promise this mapping, so
// PrefillAttentionLayoutOk() checks it on the device before the kernel that
// relies on it is used.
__device__ __forceinline__ int FragCol(int lane, int i) {
  return (lane & 3) * 2 + (i & 1) + 8 * (i >> 2);
}

// Two K/V buffers (double buffering); the Q tile is staged in the second
// K buffer before the first KV tile is fetched, or, when Q stays in shared
// memory, in a fifth tile of its own.
template <int D>
struct Smem {
  static_assert(D % 16 == 0 && D <= 256, "head size");
  static constexpr bool kQInRegs = D <= 128;
  static constexpr int kLd = D + 8;  // elements per Q/K/V row (16-byte pad)
  static constexpr size_t kTile = kKeysPerTile * kLd * 2;
  static_assert(kRowsPerTile == kKeysPerTile, "Q staged in a K-sized tile");
  __host__ __device__ static constexpr size_t K(int buf) { return buf * 2 * kTile; }
  __host__ __device__ static constexpr size_t V(int buf) { return buf * 2 * kTile + kTile; }
  static constexpr size_t kQ = kQInRegs ? 2 * kTile : 4 * kTile;  // K(1), or past the KV tiles
  static constexpr size_t kBytes = kQInRegs ? 4 * kTile : 5 * kTile;
};

// Converts 8 floats to T and stores them as one 16-byte write.
template <typename T>
__device__ __forceinline__ void Store8(T* dst, const float v[8]) {
  uint4 raw;
  T* e = reinterpret_cast<T*>(&raw);
#pragma unroll
  for (int j = 0; j < 8; ++j) e[j] = FromF<T>(v[j]);
  *reinterpret_cast<uint4*>(dst) = raw;
}

template <typename T, typename KvT, int D>
__global__ void __launch_bounds__(kThreads)
    PrefillAttentionKernel(const T* __restrict__ q, const PrefillTile* __restrict__ tiles,
                           int num_heads, PagedKv kv, float scale, T* __restrict__ out) {
  using S = Smem<D>;
  using AccFrag = wmma::fragment<wmma::accumulator, 16, 16, 16, float>;
  using AFrag = wmma::fragment<wmma::matrix_a, 16, 16, 16, T, wmma::row_major>;
  extern __shared__ __align__(128) uint8_t smem[];
  T* Qs = reinterpret_cast<T*>(smem + S::kQ);
  AllowNextGrid();
  WaitPriorGrid();

  const PrefillTile tile = tiles[blockIdx.x];
  const int h = blockIdx.y;
  const int kvh = h / (num_heads / kv.num_kv_heads);
  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
  constexpr int kGroups = D / 8;  // 8-element groups per row

  for (int i = tid; i < kRowsPerTile * kGroups; i += kThreads) {
    const int r = i / kGroups, c = (i % kGroups) * 8;
    uint4 v = make_uint4(0, 0, 0, 0);
    if (r < tile.n) {
      v = *reinterpret_cast<const uint4*>(
          q + (static_cast<size_t>(tile.first_token + r) * num_heads + h) * D + c);
    }
    *reinterpret_cast<uint4*>(Qs + r * S::kLd + c) = v;
  }
  __syncthreads();
  const int row0 = warp * 16;  // this warp's 16 query rows
  AFrag qf[S::kQInRegs ? D / 16 : 1];
  if constexpr (S::kQInRegs) {
#pragma unroll
    for (int kk = 0; kk < D / 16; ++kk)
      wmma::load_matrix_sync(qf[kk], Qs + row0 * S::kLd + kk * 16, S::kLd);
  }
  __syncthreads();  // Q's buffer is reused for K/V from here on (kQInRegs)
  AccFrag o[D / 16];
#pragma unroll
  for (int n = 0; n < D / 16; ++n) wmma::fill_fragment(o[n], 0.0f);
  // Per lane: its two rows (g and g + 8 of the warp's 16).
  const int ra = row0 + (lane >> 2), rb = ra + 8;
  const int qpos_a = ra < tile.n ? tile.pos0 + ra : -1;  // -1: row past the chunk
  const int qpos_b = rb < tile.n ? tile.pos0 + rb : -1;
  float m_a = -INFINITY, m_b = -INFINITY, l_a = 0.0f, l_b = 0.0f;
  const int kv_len = tile.pos0 + tile.n;  // keys the last query sees

  // Fetches KV tile `k0` into buffer `buf`: 16-byte cp.async copies (zero
  // fill past kv_len) when the cache holds T, else a synchronous FP8
  // dequantising load. Scales are applied to S and O, not here.
  auto fetch = [&](int k0, int buf) {
    T* ks = reinterpret_cast<T*>(smem + S::K(buf));
    T* vs = reinterpret_cast<T*>(smem + S::V(buf));
    for (int i = tid; i < kKeysPerTile * kGroups; i += kThreads) {
      const int r = i / kGroups, c = (i % kGroups) * 8;
      const int key = min(k0 + r, kv_len - 1);
      const bool valid = k0 + r < kv_len;
      const KvT* kp =
          reinterpret_cast<const KvT*>(KvSlot(kv, tile.seq, key, kvh, false, sizeof(KvT))) + c;
      const KvT* vp =
          reinterpret_cast<const KvT*>(KvSlot(kv, tile.seq, key, kvh, true, sizeof(KvT))) + c;
      if constexpr (std::is_same_v<KvT, T>) {
        __pipeline_memcpy_async(ks + r * S::kLd + c, kp, 16, valid ? 0 : 16);
        __pipeline_memcpy_async(vs + r * S::kLd + c, vp, 16, valid ? 0 : 16);
      } else {
        float kf[8], vf[8];
        Load8(kp, kf);
        Load8(vp, vf);
        if (!valid) {
#pragma unroll
          for (int j = 0; j < 8; ++j) kf[j] = vf[j] = 0.0f;
        }
        Store8(ks + r * S::kLd + c, kf);
        Store8(vs + r * S::kLd + c, vf);
      }
    }
    __pipeline_commit();
  };
  const float qk_scale = scale * kv.k_scale;
  fetch(0, 0);
  for (int k0 = 0, it = 0; k0 < kv_len; k0 += kKeysPerTile, ++it) {
    const int buf = it & 1;
    if (k0 + kKeysPerTile < kv_len) {
      fetch(k0 + kKeysPerTile, buf ^ 1);  // overlaps this tile's math
      __pipeline_wait_prior(1);
    } else {
      __pipeline_wait_prior(0);
    }
    __syncthreads();
    const T* Ks = reinterpret_cast<const T*>(smem + S::K(buf));
    const T* Vs = reinterpret_cast<const T*>(smem + S::V(buf));
    // Warp tiles beyond every causal limit contribute nothing.
    if (k0 <= tile.pos0 + min(row0 + 15, tile.n - 1)) {
      // S = Q K^T for this warp's rows, in registers.
      AccFrag sf[kKeysPerTile / 16];
#pragma unroll
      for (int n = 0; n < kKeysPerTile / 16; ++n) wmma::fill_fragment(sf[n], 0.0f);
#pragma unroll
      for (int kk = 0; kk < D / 16; ++kk) {
        const int qi = S::kQInRegs ? kk : 0;
        if constexpr (!S::kQInRegs)
          wmma::load_matrix_sync(qf[0], Qs + row0 * S::kLd + kk * 16, S::kLd);
#pragma unroll
        for (int n = 0; n < kKeysPerTile / 16; ++n) {
          wmma::fragment<wmma::matrix_b, 16, 16, 16, T, wmma::col_major> b;
          wmma::load_matrix_sync(b, Ks + (n * 16) * S::kLd + kk * 16, S::kLd);
          wmma::mma_sync(sf[n], qf[qi], b, sf[n]);
        }
      }
      // Scale, causal mask, row maxima (rows are shared by the 4 lanes of a quad).
      float mx_a = -INFINITY, mx_b = -INFINITY;
#pragma unroll
      for (int n = 0; n < kKeysPerTile / 16; ++n) {
#pragma unroll
        for (int i = 0; i < 8; ++i) {
          const bool hi = (i >> 1) & 1;
          const int key = k0 + n * 16 + FragCol(lane, i);
          const float v = key <= (hi ? qpos_b : qpos_a) ? sf[n].x[i] * qk_scale : -INFINITY;
          sf[n].x[i] = v;
          if (hi)
            mx_b = fmaxf(mx_b, v);
          else
            mx_a = fmaxf(mx_a, v);
        }
      }
#pragma unroll
      for (int off = 1; off <= 2; off <<= 1) {
        mx_a = fmaxf(mx_a, __shfl_xor_sync(0xffffffffu, mx_a, off));
        mx_b = fmaxf(mx_b, __shfl_xor_sync(0xffffffffu, mx_b, off));
      }
      const float mn_a = fmaxf(m_a, mx_a), mn_b = fmaxf(m_b, mx_b);
      const float al_a = mn_a == -INFINITY ? 1.0f : expf(m_a - mn_a);
      const float al_b = mn_b == -INFINITY ? 1.0f : expf(m_b - mn_b);
      float sum_a = 0.0f, sum_b = 0.0f;
      AFrag pf[kKeysPerTile / 16];
#pragma unroll
      for (int n = 0; n < kKeysPerTile / 16; ++n) {
#pragma unroll
        for (int i = 0; i < 8; ++i) {
          const bool hi = (i >> 1) & 1;
          const float mn = hi ? mn_b : mn_a;
          const float p = mn == -INFINITY ? 0.0f : expf(sf[n].x[i] - mn);
          if (hi)
            sum_b += p;
          else
            sum_a += p;
          pf[n].x[i] = FromF<T>(p);  // same element mapping as the accumulator
        }
      }
#pragma unroll
      for (int off = 1; off <= 2; off <<= 1) {
        sum_a += __shfl_xor_sync(0xffffffffu, sum_a, off);
        sum_b += __shfl_xor_sync(0xffffffffu, sum_b, off);
      }
      l_a = l_a * al_a + sum_a;
      l_b = l_b * al_b + sum_b;
      m_a = mn_a;
      m_b = mn_b;
      // O = diag(alpha) O + P V.
#pragma unroll
      for (int n = 0; n < D / 16; ++n) {
#pragma unroll
        for (int i = 0; i < 8; ++i) o[n].x[i] *= ((i >> 1) & 1) ? al_b : al_a;
#pragma unroll
        for (int kk = 0; kk < kKeysPerTile / 16; ++kk) {
          wmma::fragment<wmma::matrix_b, 16, 16, 16, T, wmma::row_major> b;
          wmma::load_matrix_sync(b, Vs + (kk * 16) * S::kLd + n * 16, S::kLd);
          wmma::mma_sync(o[n], pf[kk], b, o[n]);
        }
      }
    }
    __syncthreads();  // this buffer is refilled by the next iteration's fetch
  }
  // out = O / l * v_scale, written from the fragments.
#pragma unroll
  for (int n = 0; n < D / 16; ++n) {
#pragma unroll
    for (int i = 0; i < 8; ++i) {
      const bool hi = (i >> 1) & 1;
      const int r = hi ? rb : ra;
      if (r < tile.n) {
        out[(static_cast<size_t>(tile.first_token + r) * num_heads + h) * D + n * 16 +
            FragCol(lane, i)] = FromF<T>(o[n].x[i] * kv.v_scale / (hi ? l_b : l_a));
      }
    }
  }
}

// Writes, for every lane and element, the (row, col) each fragment element
// holds: accumulator fragments loaded from a float matrix and matrix_a
// fragments loaded from a bf16 matrix whose values encode their position.
__global__ void LayoutProbeKernel(const float* accm, const __nv_bfloat16* am, int* acc_out,
                                  int* a_out) {
  wmma::fragment<wmma::accumulator, 16, 16, 16, float> c;
  wmma::fragment<wmma::matrix_a, 16, 16, 16, __nv_bfloat16, wmma::row_major> a;
  wmma::load_matrix_sync(c, accm, 16, wmma::mem_row_major);
  wmma::load_matrix_sync(a, am, 16);
  const int lane = threadIdx.x;
  for (int i = 0; i < 8; ++i) {
    acc_out[lane * 8 + i] = i < c.num_elements ? static_cast<int>(c.x[i]) : -1;
    a_out[lane * 8 + i] = i < a.num_elements ? static_cast<int>(__bfloat162float(a.x[i])) : -1;
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
  return LaunchKernel(kernel, dim3(num_tiles, num_heads), kThreads, bytes, stream, q, tiles,
                      num_heads, kv, scale, out);
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

bool PrefillAttentionLayoutOk() {
  // Values are row * 16 + col (exact in bf16: below 256).
  float accm[256];
  __nv_bfloat16 am[256];
  for (int i = 0; i < 256; ++i) {
    accm[i] = static_cast<float>(i);
    am[i] = __float2bfloat16(static_cast<float>(i));
  }
  float* d_acc = nullptr;
  __nv_bfloat16* d_a = nullptr;
  int* d_out = nullptr;
  bool ok = cudaMalloc(&d_acc, sizeof(accm)) == cudaSuccess &&
            cudaMalloc(&d_a, sizeof(am)) == cudaSuccess &&
            cudaMalloc(&d_out, 2 * 256 * sizeof(int)) == cudaSuccess &&
            cudaMemcpy(d_acc, accm, sizeof(accm), cudaMemcpyHostToDevice) == cudaSuccess &&
            cudaMemcpy(d_a, am, sizeof(am), cudaMemcpyHostToDevice) == cudaSuccess;
  int got[512];
  if (ok) {
    LayoutProbeKernel<<<1, 32>>>(d_acc, d_a, d_out, d_out + 256);
    ok = cudaMemcpy(got, d_out, sizeof(got), cudaMemcpyDeviceToHost) == cudaSuccess;
  }
  cudaFree(d_acc);
  cudaFree(d_a);
  cudaFree(d_out);
  for (int lane = 0; ok && lane < 32; ++lane) {
    for (int i = 0; i < 8; ++i) {
      const int want =
          ((lane >> 2) + 8 * ((i >> 1) & 1)) * 16 + (lane & 3) * 2 + (i & 1) + 8 * (i >> 2);
      ok = ok && got[lane * 8 + i] == want && got[256 + lane * 8 + i] == want;
    }
  }
  return ok;
}

cudaError_t LaunchPrefillAttention(const void* q, const PrefillTile* tiles, int num_tiles,
                                   int num_heads, PagedKv kv, float scale, void* out, ActType type,
                                   cudaStream_t stream) {
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
