// The paged attention kernels against a plain C++ reference on the same
// (already rounded) inputs, over many shapes: head sizes 16..256 including
// 80 and 96, GQA groups 1..12 including 5:1, contexts spanning several
// tiles and partitions, decode and prefill queries, BF16/FP16/FP8 KV, the
// split-KV kernels (CUDA-core and tensor-core) and the prefill kernel.
// Skips without a GPU.
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>
#include <random>
#include <vector>

#include "engine/cuda/kernels.h"
#include "engine/dtype.h"
#include "engine/gpu_backend.h"
#include "gtest/gtest.h"
#include "tests/gpu/device_copies.h"

namespace ballast::engine::cuda {
namespace {

bool HaveGpu() { return GpuMemoryInfo(0).ok(); }

using testing::ToDevice;
using testing::ToHost;

struct AttnCase {
  int head_dim, heads, kv_heads, block_tokens;
  std::vector<int> seq_lens;  // tokens of KV per sequence
  std::vector<int> queries;   // queries per sequence (the last positions)
  KvType kv = KvType::kBF16;
  bool prefill_kernel = false;  // LaunchPrefillAttention (tiles) instead of the split-KV kernel
  // The SMs the plan is made for: few make a small batch plan as a large
  // one does on a whole GPU (the balanced rule, engine/attention_plan.h).
  int num_sms = 132;
  bool some_split = false;  // the plan must split some tokens, not all
  bool fp16_act = false;    // FP8 caches with FP16 activations (else BF16)
  // > 0: the fixed plan (deterministic mode's) with partitions of this many
  // keys, every token split; else the plan for num_sms.
  int fixed_partition = 0;
  // The plan's resident blocks an SM; 0: the kernel's (the occupancy API).
  // With few num_sms, 4 makes the slots the balanced-rule cases were
  // written for.
  int blocks_per_sm = 0;
  // The stream plan where the kernel runs it (PagedAttentionCanStream):
  // the launch's chunks shared out among num_sms x blocks_per_sm blocks.
  bool stream = false;
};

// The executor's order (CudaExecutor::WriteAttentionOrder): longest
// context first, padding last; ties in token order.
std::vector<int> LongestFirst(const std::vector<int>& pos) {
  std::vector<int> order(pos.size());
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](int a, int b) { return pos[a] > pos[b]; });
  return order;
}

// A stream plan's launches (the plan's blocks, the executor's order and
// block starts): into out, and again into a second buffer, which must
// hold the same bits, with the merge counts left zero after each.
void RunStreamed(const void* d_q, int* d_seq, int* d_pos, const std::vector<int>& tpos, int heads,
                 const PagedKv& kv, float scale, const AttentionPlan& plan, void* ws,
                 uint16_t* d_out, size_t out_elems, ActType act) {
  const int T = static_cast<int>(tpos.size());
  // The executor's order with the padding token moved to the middle: a
  // block's walk passes a token with no chunks.
  std::vector<int> order = LongestFirst(tpos);
  order.insert(order.begin() + T / 2, order.back());
  order.pop_back();
  std::vector<AttentionStreamStart> starts(plan.streamed_ctas);
  const int64_t chunks = WriteAttentionStreamStarts(
      T, [&](int s) { return tpos[order[s]] + 1; }, AttentionUnitsPerToken(heads, kv.num_kv_heads),
      plan.streamed_ctas, starts.data());
  ASSERT_GT(chunks, static_cast<int64_t>(plan.streamed_ctas)) << "every block has chunks";
  int* d_order = ToDevice(order);
  AttentionStreamStart* d_starts = ToDevice(starts);
  unsigned* d_counts = ToDevice(std::vector<unsigned>(static_cast<size_t>(T) * heads, 0u));
  uint16_t* d_again = ToDevice(std::vector<uint16_t>(out_elems, 0));
  TokenMap tm{d_seq, d_pos, T, d_order, d_starts};
  for (uint16_t* dst : {d_out, d_again}) {
    ASSERT_EQ(
        LaunchPagedAttention(d_q, tm, heads, kv, scale, plan, ws, dst, act, nullptr, d_counts),
        cudaSuccess);
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    EXPECT_EQ(ToHost(d_counts, static_cast<size_t>(T) * heads),
              std::vector<unsigned>(static_cast<size_t>(T) * heads, 0u))
        << "counts left behind";
  }
  EXPECT_EQ(ToHost(d_again, out_elems), ToHost(d_out, out_elems)) << "the same launch again";
  // Without merge counts, or without block starts, a stream plan is refused.
  EXPECT_EQ(LaunchPagedAttention(d_q, tm, heads, kv, scale, plan, ws, d_again, act, nullptr),
            cudaErrorInvalidValue);
  EXPECT_EQ(LaunchPagedAttention(d_q, TokenMap{d_seq, d_pos, T, d_order}, heads, kv, scale, plan,
                                 ws, d_again, act, nullptr, d_counts),
            cudaErrorInvalidValue);
  for (void* p : {static_cast<void*>(d_order), static_cast<void*>(d_starts),
                  static_cast<void*>(d_counts), static_cast<void*>(d_again)}) {
    cudaFree(p);
  }
}

void RunAttention(const AttnCase& c) {
  SCOPED_TRACE(::testing::Message()
               << (c.prefill_kernel ? "prefill " : "split-kv ") << "D=" << c.head_dim
               << " H=" << c.heads << " Hkv=" << c.kv_heads << " kv=" << static_cast<int>(c.kv)
               << " len0=" << c.seq_lens[0] << " q0=" << c.queries[0]
               << (c.fp16_act ? " fp16 activations" : "") << (c.stream ? " stream" : ""));
  std::mt19937 rng(1234);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  const int D = c.head_dim, Hkv = c.kv_heads, BT = c.block_tokens, S = c.seq_lens.size();
  const size_t esz = KvSize(c.kv);
  // FP16 caches go with FP16 activations, BF16 ones with BF16, FP8 ones
  // with either (fp16_act).
  const bool half = c.kv == KvType::kF16 || (c.kv == KvType::kFP8E4M3 && c.fp16_act);
  const ActType act = half ? ActType::kF16 : ActType::kBF16;
  const auto to_float = [half](uint16_t x) { return half ? HalfToFloat(x) : BF16ToFloat(x); };
  const size_t row = static_cast<size_t>(Hkv) * D * esz, block_bytes = 2 * BT * row;
  int max_blocks = 0, total_blocks = 0;
  for (int L : c.seq_lens) {
    max_blocks = std::max(max_blocks, (L + BT - 1) / BT);
    total_blocks += (L + BT - 1) / BT;
  }
  // Blocks handed out in a scrambled order, as a real allocator would.
  std::vector<int> perm(total_blocks);
  for (int i = 0; i < total_blocks; ++i) perm[i] = (i * 7 + 3) % total_blocks;
  if (std::gcd(7, total_blocks) != 1)
    for (int i = 0; i < total_blocks; ++i) perm[i] = total_blocks - 1 - i;
  std::vector<int> table(static_cast<size_t>(S) * max_blocks, 0);
  std::vector<uint8_t> pool(block_bytes * total_blocks, 0);
  // K/V values as stored (rounded), [s][pos][h][d].
  std::vector<std::vector<float>> K(S), V(S);
  int next = 0;
  const float kscale = c.kv == KvType::kFP8E4M3 ? 0.5f : 1.0f,
              vscale = c.kv == KvType::kFP8E4M3 ? 0.25f : 1.0f;
  for (int s = 0; s < S; ++s) {
    const int L = c.seq_lens[s];
    for (int b = 0; b < (L + BT - 1) / BT; ++b) table[s * max_blocks + b] = perm[next++];
    K[s].resize(static_cast<size_t>(L) * Hkv * D);
    V[s].resize(K[s].size());
    for (int p = 0; p < L; ++p) {
      uint8_t* blk =
          pool.data() + static_cast<size_t>(table[s * max_blocks + p / BT]) * block_bytes;
      for (int h = 0; h < Hkv; ++h) {
        for (int d = 0; d < D; ++d) {
          const size_t i = (static_cast<size_t>(p) * Hkv + h) * D + d;
          const size_t off = (p % BT) * row + (static_cast<size_t>(h) * D + d) * esz;
          for (int kv = 0; kv < 2; ++kv) {
            float x = nd(rng);
            uint8_t* dst = blk + (kv ? BT * row : 0) + off;
            const float sc = kv ? vscale : kscale;
            if (c.kv == KvType::kFP8E4M3) {
              *dst = FloatToFp8E4M3(x / sc);
              x = Fp8E4M3ToFloat(*dst) * sc;
            } else {
              const uint16_t b16 = half ? FloatToHalf(x) : FloatToBF16(x);
              std::memcpy(dst, &b16, 2);
              x = half ? HalfToFloat(b16) : BF16ToFloat(b16);
            }
            (kv ? V : K)[s][i] = x;
          }
        }
      }
    }
  }
  // Queries: the last queries[s] positions of each sequence.
  std::vector<int> tseq, tpos;
  for (int s = 0; s < S; ++s) {
    for (int p = c.seq_lens[s] - c.queries[s]; p < c.seq_lens[s]; ++p) {
      tseq.push_back(s);
      tpos.push_back(p);
    }
  }
  tseq.push_back(0);  // one padding token
  tpos.push_back(-1);
  const int T = tseq.size();
  std::vector<uint16_t> q(static_cast<size_t>(T) * c.heads * D);
  std::vector<float> qf(q.size());
  for (size_t i = 0; i < q.size(); ++i) {
    const float x = nd(rng);
    q[i] = half ? FloatToHalf(x) : FloatToBF16(x);
    qf[i] = to_float(q[i]);
  }
  const float scale = 1.0f / std::sqrt(static_cast<float>(D));
  int max_ctx = 0;
  for (int L : c.seq_lens) max_ctx = std::max(max_ctx, L);
  AttentionWork work;
  work.num_tokens = T;
  work.num_heads = c.heads;
  work.num_kv_heads = Hkv;
  work.max_context = max_ctx;
  for (int p : tpos) {
    work.total_context += p + 1;
    work.longest_context = std::max(work.longest_context, p + 1);
  }
  int resident = 0, stream_resident = 0;
  ASSERT_EQ(PagedAttentionBlocksPerSm(c.heads, Hkv, D, c.kv, act, &resident), cudaSuccess);
  ASSERT_EQ(PagedAttentionStreamBlocksPerSm(D, c.kv, act, &stream_resident), cudaSuccess);
  ASSERT_LE(stream_resident, resident);
  const bool stream = c.stream && stream_resident > 0;
  work.attended_tokens =
      static_cast<int>(std::count_if(tpos.begin(), tpos.end(), [](int p) { return p >= 0; }));
  if (stream) work.stream_blocks_per_sm = c.blocks_per_sm > 0 ? c.blocks_per_sm : stream_resident;
  ASSERT_GE(resident, 1);
  const AttentionPlan plan =
      c.fixed_partition > 0
          ? PlanPagedAttentionFixed(T, max_ctx, c.fixed_partition)
          : PlanPagedAttention(work, c.num_sms, c.blocks_per_sm > 0 ? c.blocks_per_sm : resident);
  uint8_t* d_pool = ToDevice(pool);
  int* d_table = ToDevice(table);
  int* d_seq = ToDevice(tseq);
  int* d_pos = ToDevice(tpos);
  uint16_t* d_q = ToDevice(q);
  uint16_t* d_out = ToDevice(std::vector<uint16_t>(q.size(), 0));
  void* ws = nullptr;
  ASSERT_EQ(cudaMalloc(&ws, std::max<size_t>(16, PagedAttentionWorkspaceBytes(plan, c.heads, D))),
            cudaSuccess);
  PagedKv kv;
  kv.block_ids = d_table;
  kv.max_blocks = max_blocks;
  kv.base = d_pool;
  kv.slab_shift = 31;
  kv.block_bytes = block_bytes;
  kv.block_tokens = BT;
  kv.num_kv_heads = Hkv;
  kv.head_dim = D;
  kv.dtype = c.kv;
  kv.k_scale = kscale;
  kv.v_scale = vscale;
  if (c.prefill_kernel) {
    std::vector<PrefillTile> tiles;
    int first = 0;
    for (int s = 0; s < S; ++s) {
      for (int j = 0; j < c.queries[s]; j += kPrefillTileTokens) {
        tiles.push_back({first + j, std::min(kPrefillTileTokens, c.queries[s] - j), s,
                         c.seq_lens[s] - c.queries[s] + j});
      }
      first += c.queries[s];
    }
    PrefillTile* d_tiles = ToDevice(tiles);
    ASSERT_EQ(
        LaunchPrefillAttention(d_q, d_tiles, tiles.size(), c.heads, kv, scale, d_out, act, nullptr),
        cudaSuccess);
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    cudaFree(d_tiles);
  } else if (stream) {
    ASSERT_GT(plan.streamed_ctas, 0) << "a stream plan";
    RunStreamed(d_q, d_seq, d_pos, tpos, c.heads, kv, scale, plan, ws, d_out, q.size(), act);
  } else {
    ASSERT_EQ(plan.streamed_ctas, 0);
    // A plan that splits only some tokens needs them first: the executor's
    // order. Otherwise any order (none: token order).
    const bool some = plan.num_partitions > 1 && plan.workspace_rows < T;
    ASSERT_EQ(some, c.some_split) << plan.num_partitions << " x " << plan.partition_tokens;
    std::vector<int> order = LongestFirst(tpos);
    int* d_first = some ? ToDevice(order) : nullptr;
    ASSERT_EQ(LaunchPagedAttention(d_q, TokenMap{d_seq, d_pos, T, d_first}, c.heads, kv, scale,
                                   plan, ws, d_out, act, nullptr),
              cudaSuccess);
    // Merged by each split token's last partition instead of a second
    // launch: the same bits, and the counts left zero (twice, so the
    // second launch starts from the first's leftovers).
    unsigned* d_counts = ToDevice(std::vector<unsigned>(static_cast<size_t>(T) * c.heads, 0u));
    for (int run = 0; run < 2; ++run) {
      uint16_t* d_fused = ToDevice(std::vector<uint16_t>(q.size(), 0));
      ASSERT_EQ(LaunchPagedAttention(d_q, TokenMap{d_seq, d_pos, T, d_first}, c.heads, kv, scale,
                                     plan, ws, d_fused, act, nullptr, d_counts),
                cudaSuccess);
      ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
      EXPECT_EQ(ToHost(d_fused, q.size()), ToHost(d_out, q.size())) << "merged in the launch";
      EXPECT_EQ(ToHost(d_counts, static_cast<size_t>(T) * c.heads),
                std::vector<unsigned>(static_cast<size_t>(T) * c.heads, 0u))
          << "counts left behind";
      cudaFree(d_fused);
    }
    cudaFree(d_counts);
    // The same launch taking its tokens in another order: the same output
    // bit for bit. Reversed, or with `some`, the split tokens reversed and
    // the rest reversed after them.
    if (some) {
      const auto split = std::partition_point(
          order.begin(), order.end(), [&](int t) { return tpos[t] >= plan.partition_tokens; });
      ASSERT_LE(split - order.begin(), plan.workspace_rows);
      std::reverse(order.begin(), split);
      std::reverse(split, order.end());
    } else {
      for (int t = 0; t < T; ++t) order[t] = T - 1 - t;
    }
    int* d_order = ToDevice(order);
    uint16_t* d_out2 = ToDevice(std::vector<uint16_t>(q.size(), 0));
    ASSERT_EQ(LaunchPagedAttention(d_q, TokenMap{d_seq, d_pos, T, d_order}, c.heads, kv, scale,
                                   plan, ws, d_out2, act, nullptr),
              cudaSuccess);
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    EXPECT_EQ(ToHost(d_out2, q.size()), ToHost(d_out, q.size())) << "tokens in reverse order";
    cudaFree(d_order);
    cudaFree(d_out2);
    if (d_first != nullptr) cudaFree(d_first);
  }
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  const auto out = ToHost(d_out, q.size());
  double max_err = 0;
  const int G = c.heads / Hkv;
  for (int t = 0; t + 1 < T; ++t) {
    const int s = tseq[t], n = tpos[t] + 1;
    for (int h = 0; h < c.heads; ++h) {
      const int kh = h / G;
      std::vector<double> sc(n);
      double mx = -1e30;
      for (int j = 0; j < n; ++j) {
        double dot = 0;
        for (int d = 0; d < D; ++d)
          dot += qf[(static_cast<size_t>(t) * c.heads + h) * D + d] *
                 K[s][(static_cast<size_t>(j) * Hkv + kh) * D + d];
        sc[j] = dot * scale;
        mx = std::max(mx, sc[j]);
      }
      double z = 0;
      for (double& x : sc) z += x = std::exp(x - mx);
      std::vector<double> o(D, 0.0);
      double mag = 1e-3;
      for (int d = 0; d < D; ++d) {
        for (int j = 0; j < n; ++j)
          o[d] += sc[j] / z * V[s][(static_cast<size_t>(j) * Hkv + kh) * D + d];
        mag = std::max(mag, std::abs(o[d]));
      }
      // BF16 rounding (of the output, and of P in the prefill kernel) is the
      // only expected error: relative to the head's largest output.
      for (int d = 0; d < D; ++d) {
        const double got = to_float(out[(static_cast<size_t>(t) * c.heads + h) * D + d]);
        max_err = std::max(max_err, std::abs(got - o[d]) / mag);
      }
    }
  }
  EXPECT_LT(max_err, 0.01) << "plan: " << plan.num_partitions << " x " << plan.partition_tokens;
  for (void* p :
       {static_cast<void*>(d_pool), static_cast<void*>(d_table), static_cast<void*>(d_seq),
        static_cast<void*>(d_pos), static_cast<void*>(d_q), static_cast<void*>(d_out), ws}) {
    cudaFree(p);
  }
}

TEST(CudaAttention, PagedAttentionMatchesReference) {
  if (!HaveGpu()) GTEST_SKIP() << "no usable GPU";
  // Head sizes 16-128 run the tensor-core kernel (FP8 caches in FP16
  // MMAs), 8 and 256 the CUDA-core one.
  for (KvType kv : {KvType::kBF16, KvType::kFP8E4M3, KvType::kF16}) {
    for (int D : {16, 32, 64, 80, 96, 128, 256}) {
      // Decode: three sequences, one query each, contexts over many tiles.
      RunAttention({D, 8, 2, 16, {1, 300, 900}, {1, 1, 1}, kv});
      // Prefill chunks: one long chunk (one partition, several tiles) and
      // a short chunk over a long prefix (several partitions).
      RunAttention({D, 8, 2, 16, {500}, {500}, kv});
      RunAttention({D, 4, 4, 16, {700}, {37}, kv});
      // GQA group above 8 heads per block (two head chunks), odd block size.
      RunAttention({D, 12, 1, 7, {260, 5}, {3, 5}, kv});
      // 5 query heads over 1 KV head: decode and a prefill chunk.
      RunAttention({D, 5, 1, 16, {333, 90}, {1, 90}, kv});
      // Spread contexts planned as a large batch: only the longest split,
      // into slots other than their tokens (1,000 and 800 into 512-key
      // partitions; 900 into 256-key ones with two head chunks); the
      // others write their output directly.
      RunAttention({D,
                    8,
                    2,
                    16,
                    {40, 1000, 7, 800, 20, 1},
                    {1, 1, 1, 1, 1, 1},
                    kv,
                    false,
                    2,
                    true,
                    false,
                    0,
                    4});
      RunAttention({D, 12, 1, 7, {5, 900, 60}, {5, 1, 1}, kv, false, 2, true, false, 0, 4});
      // The stream plan on few SMs (each case 1.2-1.5 waves of unsplit
      // blocks), so that its blocks cut units in many places: 8 blocks
      // over spread contexts (a unit cut among three blocks, whole units
      // written directly); 12 over two head groups a KV head (the second
      // of 4 heads) and an odd block size; 10 over one long context and
      // two short ones; 8 over three equal contexts, where every other
      // block starts exactly at a unit (written directly, or the unit's
      // first piece). Head sizes of the tensor-core kernel only.
      if (D <= 128) {
        AttnCase s1{D, 8, 2, 16, {40, 1000, 7, 800, 20, 1}, {1, 1, 1, 1, 1, 1}, kv};
        s1.num_sms = 2, s1.blocks_per_sm = 4, s1.stream = true;
        RunAttention(s1);
        AttnCase s2{D, 12, 1, 7, {5, 900, 60, 333}, {5, 1, 1, 2}, kv};
        s2.num_sms = 4, s2.blocks_per_sm = 3, s2.stream = true;
        RunAttention(s2);
        AttnCase s3{D, 4, 4, 16, {2000, 3}, {2, 1}, kv};
        s3.num_sms = 2, s3.blocks_per_sm = 5, s3.stream = true;
        RunAttention(s3);
        AttnCase s4{D, 4, 4, 16, {1024, 1024, 1024}, {1, 1, 1}, kv};
        s4.num_sms = 2, s4.blocks_per_sm = 4, s4.stream = true;
        RunAttention(s4);
      }
      if (D == 64 || D == 128) {
        // More partitions than a warp has lanes (the merge loops over
        // them): 4,500 keys in 36 fixed 128-key partitions, as
        // deterministic mode cuts long contexts.
        AttnCase f{D, 8, 2, 16, {4500, 1000, 5}, {1, 1, 1}, kv};
        f.fixed_partition = 128;
        RunAttention(f);
      }
    }
    if (kv == KvType::kFP8E4M3) {  // FP8 caches with FP16 activations: decodes, a chunk
      for (int D : {16, 64, 80, 128, 256}) {
        AttnCase d{D, 8, 2, 16, {1, 300, 900}, {1, 1, 1}, kv};
        d.fp16_act = true;
        RunAttention(d);
        AttnCase g{D, 12, 2, 7, {5, 900, 60}, {5, 1, 1}, kv, false, 2, true};  // groups of 6
        g.fp16_act = true;
        g.blocks_per_sm = 4;
        RunAttention(g);
        AttnCase p{D, 4, 4, 16, {700}, {37}, kv};
        p.fp16_act = true;
        RunAttention(p);
        if (D <= 128) {
          AttnCase st{D, 8, 2, 16, {40, 1000, 7, 800, 20, 1}, {1, 1, 1, 1, 1, 1}, kv};
          st.fp16_act = true, st.num_sms = 2, st.blocks_per_sm = 4, st.stream = true;
          RunAttention(st);
        }
      }
    }
    for (int D : {64, 80, 96, 128, 256}) {  // the tensor-core prefill kernel
      ASSERT_TRUE(PrefillAttentionSupports(D)) << D;
      RunAttention({D, 8, 2, 16, {500}, {500}, kv, true});
      RunAttention({D, 4, 4, 16, {700}, {37}, kv, true});
      RunAttention({D, 12, 3, 7, {260, 100}, {130, 17}, kv, true});
      RunAttention({D, 10, 2, 16, {150, 70}, {150, 20}, kv, true});  // groups of 5
    }
  }
}

// The executor accepts exactly the head sizes the kernels are built for;
// the tensor-core prefill kernel serves a subset of them.
TEST(CudaAttention, HeadDimListsAgree) {
  for (int d = 2; d <= 512; d += 2) {
    if (PrefillAttentionSupports(d)) {
      EXPECT_TRUE(PagedAttentionSupports(d)) << d;
    }
  }
  for (int d : {8, 16, 32, 64, 80, 96, 128, 256}) EXPECT_TRUE(PagedAttentionSupports(d)) << d;
  for (int d : {0, 4, 12, 72, 100, 130, 512}) EXPECT_FALSE(PagedAttentionSupports(d)) << d;
}

// The plan's resident blocks per SM, from the occupancy API: the
// tensor-core kernel's shared memory (68 KB at head sizes 80-128 with
// BF16 KV, half that with FP8) bounds it on sm_90; unsupported shapes fail.
TEST(CudaAttention, ResidentBlocksFollowTheKernelsSharedMemory) {
  if (!HaveGpu()) GTEST_SKIP() << "no usable GPU";
  int major = 0;
  ASSERT_EQ(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, 0), cudaSuccess);
  int bf16 = 0, fp8 = 0, d64 = 0, core = 0, bad = 0;
  ASSERT_EQ(PagedAttentionBlocksPerSm(32, 8, 128, KvType::kBF16, ActType::kBF16, &bf16),
            cudaSuccess);
  ASSERT_EQ(PagedAttentionBlocksPerSm(32, 8, 128, KvType::kFP8E4M3, ActType::kBF16, &fp8),
            cudaSuccess);
  ASSERT_EQ(PagedAttentionBlocksPerSm(32, 8, 64, KvType::kBF16, ActType::kBF16, &d64), cudaSuccess);
  ASSERT_EQ(PagedAttentionBlocksPerSm(16, 4, 256, KvType::kBF16, ActType::kBF16, &core),
            cudaSuccess);  // the CUDA-core kernel
  EXPECT_GE(bf16, 1);
  EXPECT_GT(fp8, bf16);  // half the staged bytes
  EXPECT_GT(d64, bf16);
  EXPECT_GE(core, 1);
  if (major == 9) {
    EXPECT_EQ(bf16, 3);  // 228 KB of shared memory an SM
  }
  EXPECT_NE(PagedAttentionBlocksPerSm(30, 8, 128, KvType::kBF16, ActType::kBF16, &bad),
            cudaSuccess);  // 30 heads over 8
  EXPECT_NE(PagedAttentionBlocksPerSm(32, 8, 100, KvType::kBF16, ActType::kBF16, &bad),
            cudaSuccess);  // no kernel for 100
}

}  // namespace
}  // namespace ballast::engine::cuda
