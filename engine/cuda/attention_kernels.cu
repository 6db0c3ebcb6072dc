// Paged causal attention for mixed prefill/decode batches, split over the
// KV length (flash-decoding): each block handles one query token, up to 8
// query heads sharing one kv head (GQA), and one partition of the context,
// in tiles of kTile keys with an online softmax. Partitions are merged by
// PartitionMergeKernel. CUDA cores, FP32 accumulation. Head sizes are
// multiples of 8 (BALLAST_ATTENTION_HEAD_DIMS); where D / 8 does not divide
// the block, the threads past the last full V row idle in the P V phase.
#include <algorithm>

#include "engine/cuda/common.cuh"

namespace ballast::engine::cuda {
namespace {

constexpr int kThreads = 128;
constexpr int kTile = 128;    // keys per tile: one per thread in the score phase
constexpr int kMaxGroup = 8;  // query heads per block
constexpr int kMinPartition = 64;

struct Workspace {
  float* o;  // [T][H][parts][D], unnormalised
  float* m;  // [T][H][parts], running max (-inf: empty partition)
  float* l;  // [T][H][parts], softmax denominator
};

template <typename T, typename KvT, int D>
__global__ void __launch_bounds__(kThreads)
    PagedAttentionKernel(const T* __restrict__ q, TokenMap tokens, int num_heads, PagedKv kv,
                         float scale, int partition_tokens, Workspace ws, T* __restrict__ out) {
  static_assert(D % 8 == 0 && D <= 256, "head size");
  constexpr int kCols = D / 8;             // threads per V row (8 elements each)
  constexpr int kRows = kThreads / kCols;  // V rows processed in parallel
  __shared__ float q_s[kMaxGroup][D];
  __shared__ float s_s[kMaxGroup][kTile];
  __shared__ float red[kRows * kMaxGroup * D];
  __shared__ float m_s[kMaxGroup], l_s[kMaxGroup], alpha_s[kMaxGroup];

  const int t = blockIdx.x;
  const int pos = tokens.pos[t];
  if (pos < 0) return;
  const int seq = tokens.seq[t];
  const int parts = gridDim.z, part = blockIdx.z;
  const int group = num_heads / kv.num_kv_heads;
  const int chunks = (group + kMaxGroup - 1) / kMaxGroup;
  const int kvh = blockIdx.y / chunks, g0 = (blockIdx.y % chunks) * kMaxGroup;
  const int ng = min(kMaxGroup, group - g0);
  const int head0 = kvh * group + g0;
  const int ctx = pos + 1;
  const int start = part * partition_tokens;
  const int end = min(ctx, start + partition_tokens);
  const int tid = threadIdx.x;

  if (start >= end) {  // only with parts > 1: an empty partition
    if (tid < ng) {
      const size_t i = (static_cast<size_t>(t) * num_heads + head0 + tid) * parts + part;
      ws.m[i] = -INFINITY;
      ws.l[i] = 0.0f;
    }
    return;
  }
  for (int i = tid; i < ng * D; i += kThreads) {
    q_s[i / D][i % D] = ToF(q[(static_cast<size_t>(t) * num_heads + head0) * D + i]) * scale;
  }
  if (tid < kMaxGroup) {
    m_s[tid] = -INFINITY;
    l_s[tid] = 0.0f;
  }
  float acc[kMaxGroup][8];
#pragma unroll
  for (int g = 0; g < kMaxGroup; ++g)
#pragma unroll
    for (int j = 0; j < 8; ++j) acc[g][j] = 0.0f;
  __syncthreads();

  const int warp = tid >> 5, lane = tid & 31;
  const int r = tid / kCols, c = tid % kCols;
  // False for the kThreads % kCols spare threads (none for powers of two).
  const bool pv_thread = kThreads % kCols == 0 || r < kRows;
  for (int tile = start; tile < end; tile += kTile) {
    const int n = min(kTile, end - tile);
    // Scores: thread tid takes key tile + tid.
    if (tid < n) {
      const KvT* k =
          reinterpret_cast<const KvT*>(KvSlot(kv, seq, tile + tid, kvh, false, sizeof(KvT)));
      float s[kMaxGroup];
#pragma unroll
      for (int g = 0; g < kMaxGroup; ++g) s[g] = 0.0f;
#pragma unroll 4
      for (int cc = 0; cc < kCols; ++cc) {
        float kf[8];
        Load8(k + cc * 8, kf);
#pragma unroll
        for (int g = 0; g < kMaxGroup; ++g) {
          if (g < ng) {
#pragma unroll
            for (int j = 0; j < 8; ++j) s[g] += q_s[g][cc * 8 + j] * kf[j];
          }
        }
      }
#pragma unroll
      for (int g = 0; g < kMaxGroup; ++g)
        if (g < ng) s_s[g][tid] = s[g] * kv.k_scale;
    }
    __syncthreads();
    // Online softmax: warp w updates heads w, w + 4.
    for (int g = warp; g < ng; g += kThreads / 32) {
      float mx = -INFINITY;
      for (int i = lane; i < n; i += 32) mx = fmaxf(mx, s_s[g][i]);
      mx = WarpMax(mx);
      const float m_old = m_s[g];
      const float m_new = fmaxf(m_old, mx);
      float sum = 0.0f;
      for (int i = lane; i < n; i += 32) {
        const float p = expf(s_s[g][i] - m_new);
        s_s[g][i] = p;
        sum += p;
      }
      sum = WarpSum(sum);
      if (lane == 0) {
        const float a = expf(m_old - m_new);
        alpha_s[g] = a;
        l_s[g] = l_s[g] * a + sum;
        m_s[g] = m_new;
      }
    }
    __syncthreads();
    // P V: thread (r, c) takes rows r, r + kRows, ... and 8 columns.
#pragma unroll
    for (int g = 0; g < kMaxGroup; ++g) {
      if (g < ng) {
        const float a = alpha_s[g];
#pragma unroll
        for (int j = 0; j < 8; ++j) acc[g][j] *= a;
      }
    }
    for (int i = pv_thread ? r : n; i < n; i += kRows) {
      const KvT* v =
          reinterpret_cast<const KvT*>(KvSlot(kv, seq, tile + i, kvh, true, sizeof(KvT)));
      float vf[8];
      Load8(v + c * 8, vf);
#pragma unroll
      for (int g = 0; g < kMaxGroup; ++g) {
        if (g < ng) {
          const float p = s_s[g][i] * kv.v_scale;
#pragma unroll
          for (int j = 0; j < 8; ++j) acc[g][j] += p * vf[j];
        }
      }
    }
    __syncthreads();
  }
  // Merge the kRows partial sums.
  if (pv_thread) {
#pragma unroll
    for (int g = 0; g < kMaxGroup; ++g)
#pragma unroll
      for (int j = 0; j < 8; ++j) red[(r * kMaxGroup + g) * D + c * 8 + j] = acc[g][j];
  }
  __syncthreads();
  for (int i = tid; i < ng * D; i += kThreads) {
    const int g = i / D, d = i % D;
    float sum = 0.0f;
#pragma unroll 4
    for (int rr = 0; rr < kRows; ++rr) sum += red[(rr * kMaxGroup + g) * D + d];
    const size_t th = static_cast<size_t>(t) * num_heads + head0 + g;
    if (parts == 1) {
      out[th * D + d] = FromF<T>(sum / l_s[g]);
    } else {
      ws.o[(th * parts + part) * D + d] = sum;
      if (d == 0) {
        ws.m[th * parts + part] = m_s[g];
        ws.l[th * parts + part] = l_s[g];
      }
    }
  }
}

template <typename T>
__global__ void PartitionMergeKernel(TokenMap tokens, int parts, int head_dim, Workspace ws,
                                     T* __restrict__ out) {
  const int t = blockIdx.x;
  if (tokens.pos[t] < 0) return;
  const size_t th = static_cast<size_t>(t) * gridDim.y + blockIdx.y;
  float mx = -INFINITY;
  for (int p = 0; p < parts; ++p) mx = fmaxf(mx, ws.m[th * parts + p]);
  float denom = 0.0f;
  for (int p = 0; p < parts; ++p) {
    const float m = ws.m[th * parts + p];
    if (m != -INFINITY) denom += expf(m - mx) * ws.l[th * parts + p];
  }
  for (int d = threadIdx.x; d < head_dim; d += blockDim.x) {
    float num = 0.0f;
    for (int p = 0; p < parts; ++p) {
      const float m = ws.m[th * parts + p];
      if (m != -INFINITY) num += expf(m - mx) * ws.o[(th * parts + p) * head_dim + d];
    }
    out[th * head_dim + d] = FromF<T>(num / denom);
  }
}

Workspace Carve(void* workspace, int T, int H, int D, int parts) {
  Workspace w;
  w.o = static_cast<float*>(workspace);
  w.m = w.o + static_cast<size_t>(T) * H * parts * D;
  w.l = w.m + static_cast<size_t>(T) * H * parts;
  return w;
}

template <typename T, typename KvT>
cudaError_t LaunchForHeadDim(const T* q, TokenMap tokens, int num_heads, const PagedKv& kv,
                             float scale, const AttentionPlan& plan, Workspace ws, T* out,
                             cudaStream_t stream) {
  const int group = num_heads / kv.num_kv_heads;
  const dim3 grid(tokens.num_tokens, kv.num_kv_heads * ((group + kMaxGroup - 1) / kMaxGroup),
                  plan.num_partitions);
#define BALLAST_ATTN_CASE(DIM)                                            \
  case DIM:                                                               \
    PagedAttentionKernel<T, KvT, DIM><<<grid, kThreads, 0, stream>>>(     \
        q, tokens, num_heads, kv, scale, plan.partition_tokens, ws, out); \
    break;
  switch (kv.head_dim) {
    BALLAST_ATTENTION_HEAD_DIMS(BALLAST_ATTN_CASE)
    default:
      return cudaErrorInvalidValue;
  }
#undef BALLAST_ATTN_CASE
  cudaError_t e = cudaGetLastError();
  if (e != cudaSuccess || plan.num_partitions == 1) return e;
  PartitionMergeKernel<T>
      <<<dim3(tokens.num_tokens, num_heads), std::min(kv.head_dim, 128), 0, stream>>>(
          tokens, plan.num_partitions, kv.head_dim, ws, out);
  return cudaGetLastError();
}

}  // namespace

bool PagedAttentionSupports(int head_dim) {
#define BALLAST_ATTN_SUPPORTS(DIM) \
  if (head_dim == DIM) return true;
  BALLAST_ATTENTION_HEAD_DIMS(BALLAST_ATTN_SUPPORTS)
#undef BALLAST_ATTN_SUPPORTS
  return false;
}

AttentionPlan PlanPagedAttention(int num_tokens, int num_heads, int num_kv_heads, int max_context,
                                 int num_sms) {
  AttentionPlan p;
  const int group = num_heads / num_kv_heads;
  const long base =
      static_cast<long>(num_tokens) * num_kv_heads * ((group + kMaxGroup - 1) / kMaxGroup);
  max_context = std::max(max_context, 1);
  if (base >= 2L * num_sms || max_context <= kMinPartition) {
    p.num_partitions = 1;
    p.partition_tokens = max_context;
    return p;
  }
  const long want = (4L * num_sms + base - 1) / base;  // about four blocks per SM
  int parts =
      static_cast<int>(std::min<long>(want, (max_context + kMinPartition - 1) / kMinPartition));
  parts = std::max(parts, 1);
  int len = (max_context + parts - 1) / parts;
  len = (len + kMinPartition - 1) / kMinPartition * kMinPartition;
  p.partition_tokens = len;
  p.num_partitions = (max_context + len - 1) / len;
  return p;
}

AttentionPlan PlanPagedAttentionFixed(int max_context, int partition_tokens) {
  AttentionPlan p;
  p.partition_tokens = std::max(1, (partition_tokens + kTile - 1) / kTile) * kTile;
  p.num_partitions = std::max(1, (max_context + p.partition_tokens - 1) / p.partition_tokens);
  return p;
}

size_t PagedAttentionWorkspaceBytes(int num_tokens, int num_heads, int head_dim,
                                    const AttentionPlan& plan) {
  if (plan.num_partitions <= 1) return 0;
  const size_t th = static_cast<size_t>(num_tokens) * num_heads * plan.num_partitions;
  return th * (head_dim + 2) * sizeof(float);
}

cudaError_t LaunchPagedAttention(const void* q, TokenMap tokens, int num_heads, PagedKv kv,
                                 float scale, const AttentionPlan& plan, void* workspace, void* out,
                                 ActType type, cudaStream_t stream) {
  if (tokens.num_tokens == 0) return cudaSuccess;
  if (kv.num_kv_heads <= 0 || num_heads % kv.num_kv_heads != 0) return cudaErrorInvalidValue;
  const Workspace ws =
      Carve(workspace, tokens.num_tokens, num_heads, kv.head_dim, plan.num_partitions);
  BALLAST_DISPATCH_ACT(type, T, {
    const T* qt = static_cast<const T*>(q);
    T* o = static_cast<T*>(out);
    // KV is stored in the activation type or in FP8.
    if (kv.dtype == KvType::kFP8E4M3) {
      return LaunchForHeadDim<T, __nv_fp8_e4m3>(qt, tokens, num_heads, kv, scale, plan, ws, o,
                                                stream);
    }
    const bool same = (kv.dtype == KvType::kBF16) == (type == ActType::kBF16);
    if (!same) return cudaErrorInvalidValue;
    return LaunchForHeadDim<T, T>(qt, tokens, num_heads, kv, scale, plan, ws, o, stream);
  });
  return cudaErrorInvalidValue;
}

}  // namespace ballast::engine::cuda
