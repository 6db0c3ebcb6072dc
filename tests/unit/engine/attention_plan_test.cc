// The split-KV attention's plan (engine/attention_plan.h), without a GPU:
// small batches fill the device as before; large batches split only the
// contexts past a balanced share, and never more tokens than the workspace
// bound holds (checked by brute force over random batches).
#include "engine/attention_plan.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <utility>
#include <vector>

namespace ballast::engine {
namespace {

constexpr int kSms = 132;  // an H100/H200
constexpr int kBps = 3;    // the tensor-core kernel's resident blocks there (8B, BF16 KV)

// Llama-3-8B's heads (32 over 8 KV heads: one block per KV head a token).
AttentionWork Llama8b(const std::vector<int>& contexts, int max_context = 0) {
  AttentionWork w;
  w.num_tokens = static_cast<int>(contexts.size());
  w.num_heads = 32;
  w.num_kv_heads = 8;
  for (int c : contexts) {
    w.total_context += c;
    w.longest_context = std::max(w.longest_context, c);
  }
  w.max_context = max_context > 0 ? max_context : w.longest_context;
  return w;
}

TEST(AttentionPlan, OneSequenceFillsTheDevice) {
  // 8 blocks on 132 SMs of 3 slots: 49 partitions fit one wave; 4,096 / 49
  // keys rounded up to 128, so 32 of them.
  const AttentionPlan p = PlanPagedAttention(Llama8b({4096}), kSms, kBps);
  EXPECT_EQ(p.partition_tokens, 128);
  EXPECT_EQ(p.num_partitions, 32);
  EXPECT_EQ(p.workspace_rows, 1);
  // 4 slots an SM: 66 fit, at most 4,096 / 64 = 64 of 64 keys.
  const AttentionPlan four = PlanPagedAttention(Llama8b({4096}), kSms, 4);
  EXPECT_EQ(four.partition_tokens, 64);
  EXPECT_EQ(four.num_partitions, 64);
  // A context of one partition is not split, and needs no workspace.
  const AttentionPlan q = PlanPagedAttention(Llama8b({50}), kSms, kBps);
  EXPECT_EQ(q.num_partitions, 1);
  EXPECT_EQ(PagedAttentionWorkspaceBytes(q, 32, 128), 0u);
}

// Few blocks: every token's partitions start in one wave of the slots,
// never in a second, partial one (measured on an H100: batches 8-24 at
// context 1,024, docs/benchmarks.md, session 62).
TEST(AttentionPlan, FewBlocksFitOneWave) {
  struct Case {
    int batch, partitions, partition_tokens;
  };
  // Context 1,040 (a graph bucket's bound past 1,024 keys), 8 blocks a token;
  // lengths are multiples of 64.
  for (const Case c : {Case{8, 6, 192}, Case{16, 3, 384}, Case{24, 2, 576}, Case{32, 1, 1088}}) {
    const AttentionPlan p =
        PlanPagedAttention(Llama8b(std::vector<int>(c.batch, 1040)), kSms, kBps);
    EXPECT_EQ(p.num_partitions, c.partitions) << c.batch;
    EXPECT_EQ(p.partition_tokens, c.partition_tokens) << c.batch;
  }
  for (int sms : {1, 7, 132}) {
    for (int bps : {1, 3, 4, 5}) {
      for (int t = 1; t * 8 < 2 * sms; ++t) {
        for (int ctx : {1, 63, 64, 65, 300, 1024, 1040, 4096, 32768}) {
          const AttentionPlan p = PlanPagedAttention(Llama8b(std::vector<int>(t, ctx)), sms, bps);
          ASSERT_LE(static_cast<int64_t>(t) * 8 * p.num_partitions,
                    std::max<int64_t>(static_cast<int64_t>(bps) * sms, t * 8))
              << t << " x " << ctx << " on " << sms << " x " << bps;
          ASSERT_GE(static_cast<int64_t>(p.partition_tokens) * p.num_partitions, ctx);
        }
      }
    }
  }
}

TEST(AttentionPlan, EqualContextsInALargeBatchAreNotSplit) {
  for (int batch : {64, 256, 1000}) {
    for (int ctx : {300, 1024, 1040, 4096}) {  // 1,040: just past a 1,024 partition
      const AttentionPlan p = PlanPagedAttention(Llama8b(std::vector<int>(batch, ctx)), kSms, kBps);
      EXPECT_EQ(p.num_partitions, 1) << batch << " x " << ctx;
      EXPECT_EQ(p.workspace_rows, 0);
    }
  }
}

TEST(AttentionPlan, ALongContextAmongShortOnesIsSplit) {
  // 63 contexts of 500 and one of 4,000: a share is 35,500 keys x 8 heads
  // over 396 resident blocks = 718, so partitions of 1,024 (4 cover 4,096).
  std::vector<int> ctx(63, 500);
  ctx.push_back(4000);
  const AttentionPlan p = PlanPagedAttention(Llama8b(ctx, 4096), kSms, kBps);
  EXPECT_EQ(p.partition_tokens, 1024);
  EXPECT_EQ(p.num_partitions, 4);
  EXPECT_EQ(p.workspace_rows, 50);  // at most 396 / 8 split tokens
  // Unknown contexts: nothing to balance against, not split.
  AttentionWork w = Llama8b(ctx, 4096);
  w.total_context = 0;
  EXPECT_EQ(PlanPagedAttention(w, kSms, kBps).num_partitions, 1);
}

TEST(AttentionPlan, PartitionsAreCappedForVeryLongContexts) {
  std::vector<int> ctx(100, 20);
  ctx.push_back(120000);
  const AttentionPlan p = PlanPagedAttention(Llama8b(ctx), kSms, kBps);
  EXPECT_LE(p.num_partitions, kMaxSplitPartitions);
  EXPECT_GE(p.partition_tokens * p.num_partitions, 120000);
}

TEST(AttentionPlan, FixedPlanSplitsEveryTokenAtOneLength) {
  const AttentionPlan p = PlanPagedAttentionFixed(10, 1000, 500);
  EXPECT_EQ(p.partition_tokens, 512);
  EXPECT_EQ(p.num_partitions, 2);
  EXPECT_EQ(p.workspace_rows, 10);
  EXPECT_EQ(PagedAttentionWorkspaceBytes(p, 4, 64), 10u * 4 * 2 * (64 + 2) * sizeof(float));
  EXPECT_EQ(PlanPagedAttentionFixed(10, 300, 500).num_partitions, 1);
}

// The few-blocks rule at every token count and context up to a short
// limit: a context below the limit can round to more partitions than the
// limit itself (256 with 29 tokens: 2 of 128, but 160: 3 of 64); the bound
// holds them.
TEST(AttentionPlan, FewBlocksBoundHoldsBelowTheLongestContext) {
  for (int sms : {1, 7, 132}) {
    const size_t bound = MaxPagedAttentionWorkspaceBytes(64, 32, 8, 128, 256, sms, kBps);
    for (int t = 1; t <= 64; ++t) {
      for (int c = 1; c <= 256; ++c) {
        AttentionWork w = Llama8b(std::vector<int>(t, c));
        const AttentionPlan p = PlanPagedAttention(w, sms, kBps);
        ASSERT_LE(PagedAttentionWorkspaceBytes(p, 32, 128), bound) << t << " x " << c;
      }
    }
  }
}

// Random batches (log-normal contexts, as a server's), many shapes: every
// plan covers the longest context, the split tokens fit workspace_rows, and
// the workspace stays within the executor's bound, and the bound grows
// with the resident blocks an SM.
TEST(AttentionPlan, SplitTokensAlwaysFitTheWorkspaceBound) {
  std::mt19937_64 rng(7);
  struct Heads {
    int q, kv, dim;
  };
  int balanced_splits = 0;
  for (const Heads h : {Heads{32, 8, 128}, Heads{12, 1, 64}, Heads{64, 8, 128}, Heads{8, 8, 64}}) {
    for (const auto& [sms, bps] : {std::pair{1, 4}, std::pair{16, 1}, std::pair{132, 3},
                                   std::pair{132, 4}, std::pair{132, 5}, std::pair{132, 6}}) {
      const int max_tokens = 1024, max_context = 32768;
      const size_t bound =
          MaxPagedAttentionWorkspaceBytes(max_tokens, h.q, h.kv, h.dim, max_context, sms, bps);
      ASSERT_LE(bound, MaxPagedAttentionWorkspaceBytes(max_tokens, h.q, h.kv, h.dim, max_context,
                                                       sms, bps + 1));
      for (int trial = 0; trial < 300; ++trial) {
        const int n = 1 + static_cast<int>(rng() % max_tokens);
        const double mean = 16.0 + static_cast<double>(rng() % 4000);
        const double sigma = static_cast<double>(rng() % 200) / 100.0;
        std::lognormal_distribution<double> draw(std::log(mean) - sigma * sigma / 2, sigma);
        std::vector<int> ctx(n);
        for (int& c : ctx) {
          c = static_cast<int>(std::clamp(draw(rng), 1.0, static_cast<double>(max_context)));
        }
        AttentionWork w = Llama8b(ctx);
        w.num_heads = h.q;
        w.num_kv_heads = h.kv;
        // A graph bucket's bound: up to twice the longest, within the limit.
        w.max_context = std::min(max_context, w.longest_context * (1 + trial % 2));
        const AttentionPlan p = PlanPagedAttention(w, sms, bps);
        ASSERT_GE(static_cast<int64_t>(p.partition_tokens) * p.num_partitions, w.max_context);
        ASSERT_GE(p.partition_tokens, 1);
        const int split = static_cast<int>(
            std::count_if(ctx.begin(), ctx.end(), [&](int c) { return c > p.partition_tokens; }));
        if (p.num_partitions > 1) {
          ASSERT_LE(split, p.workspace_rows) << "n " << n << " sms " << sms;
          balanced_splits += p.workspace_rows < n;
        } else {
          ASSERT_EQ(split, 0);
        }
        ASSERT_LE(PagedAttentionWorkspaceBytes(p, h.q, h.dim), bound);
      }
    }
  }
  EXPECT_GT(balanced_splits, 100);  // the balanced rule was exercised
}

// The stream plan: a large batch on a kernel that streams gets one wave
// of blocks and no partitions; the same batch on one that does not, or a
// launch too small to share out, keeps the partitioned rules.
TEST(AttentionPlan, StreamPlanTakesABatchOfOneAndAHalfWaves) {
  // 64 x 8 blocks on 396 slots: 1.29 waves.
  AttentionWork w = Llama8b(std::vector<int>(64, 1024));
  EXPECT_EQ(PlanPagedAttention(w, kSms, kBps).streamed_ctas, 0);
  w.stream_blocks_per_sm = kBps;
  const AttentionPlan p = PlanPagedAttention(w, kSms, kBps);
  EXPECT_EQ(p.streamed_ctas, kSms * kBps);
  EXPECT_EQ(p.num_partitions, 1);
  EXPECT_EQ(p.workspace_rows, 64);
  EXPECT_EQ(PagedAttentionWorkspaceBytes(p, 32, 128),
            2u * kSms * kBps * kAttentionMaxGroup * (128 + 2) * sizeof(float));
  // The stream kernel keeps fewer blocks resident: its own wave.
  w.stream_blocks_per_sm = 2;
  EXPECT_EQ(PlanPagedAttention(w, kSms, kBps).streamed_ctas, kSms * 2);
  w.stream_blocks_per_sm = 7;  // never past the partitioned kernel's
  EXPECT_EQ(PlanPagedAttention(w, kSms, kBps).streamed_ctas, kSms * kBps);
  // Padding tokens of a graph bucket are not attended: 64 of 96 still
  // make 1.29 waves.
  AttentionWork padded = Llama8b(std::vector<int>(64, 1024));
  padded.num_tokens = 96;
  padded.attended_tokens = 64;
  padded.stream_blocks_per_sm = kBps;
  EXPECT_EQ(PlanPagedAttention(padded, kSms, kBps).streamed_ctas, kSms * kBps);
  // Fuller waves (one, two, five): the partitioned rules.
  for (int batch : {48, 128, 256}) {
    AttentionWork full = Llama8b(std::vector<int>(batch, 1024));
    full.stream_blocks_per_sm = kBps;
    EXPECT_EQ(PlanPagedAttention(full, kSms, kBps).streamed_ctas, 0) << batch;
  }
  // Few blocks: the few-blocks rule, stream or not.
  AttentionWork small = Llama8b(std::vector<int>(8, 1024));
  small.stream_blocks_per_sm = kBps;
  EXPECT_EQ(PlanPagedAttention(small, kSms, kBps).streamed_ctas, 0);
  // 64 contexts of 40 keys: 3 chunks a unit, 1,536 in all, under 8 a block.
  AttentionWork brief = Llama8b(std::vector<int>(64, 40));
  brief.stream_blocks_per_sm = kBps;
  EXPECT_EQ(PlanPagedAttention(brief, kSms, kBps).streamed_ctas, 0);
  // Unknown contexts: nothing to share out.
  w.total_context = 0;
  EXPECT_EQ(PlanPagedAttention(w, kSms, kBps).streamed_ctas, 0);
}

// Every block's start, checked by brute force over random launches: the
// slot it names holds its first chunk (skipped tokens passed), the slot's
// first chunk is the chunks of the slots before it, and
// AttentionStreamBlockOf finds each chunk's block.
TEST(AttentionPlan, StreamStartsPointAtEachBlocksFirstChunk) {
  std::mt19937_64 rng(11);
  for (int trial = 0; trial < 400; ++trial) {
    const int n = 1 + static_cast<int>(rng() % 300);
    std::vector<int> ctx(n);
    for (int& c : ctx) c = rng() % 5 == 0 ? 0 : 1 + static_cast<int>(rng() % 3000);
    const int units = 1 + static_cast<int>(rng() % 16);
    const int ctas = 1 + static_cast<int>(rng() % 700);
    std::vector<AttentionStreamStart> starts(ctas);
    const int64_t total = WriteAttentionStreamStarts(
        n, [&](int s) { return ctx[s]; }, units, ctas, starts.data());
    std::vector<int64_t> before(n + 1, 0);  // chunks before slot s
    for (int s = 0; s < n; ++s) before[s + 1] = before[s] + units * AttentionStreamChunks(ctx[s]);
    ASSERT_EQ(total, before[n]);
    for (int b = 0; b < ctas; ++b) {
      ASSERT_EQ(starts[b].total_chunks, total);
      const int64_t first = b * total / ctas, end = (b + 1) * total / ctas;
      if (first == end) continue;  // no chunks: the kernel returns
      const int s = starts[b].slot;
      ASSERT_EQ(starts[b].slot_chunk, before[s]) << "trial " << trial << " block " << b;
      ASSERT_LE(before[s], first);
      ASSERT_LT(first, before[s + 1]) << "the slot holds the block's first chunk";
      for (int64_t j = first; j < end; j += std::max<int64_t>(1, (end - first) / 3)) {
        ASSERT_EQ(AttentionStreamBlockOf(j, total, ctas), b);
      }
      ASSERT_EQ(AttentionStreamBlockOf(end - 1, total, ctas), b);
    }
  }
}

// The executor sizes its workspace once for every plan: the bound holds
// the stream plan's pieces too, for every shape.
TEST(AttentionPlan, WorkspaceBoundHoldsTheStreamPlan) {
  for (const auto& [sms, bps] : {std::pair{16, 4}, std::pair{132, 3}, std::pair{132, 6}}) {
    for (int dim : {64, 128}) {
      const int tokens = (sms * bps * 5 / 4) / 8;  // about 1.25 waves of 8 blocks a token
      AttentionWork w = Llama8b(std::vector<int>(tokens, 2000));
      w.stream_blocks_per_sm = bps;
      const AttentionPlan p = PlanPagedAttention(w, sms, bps);
      ASSERT_GT(p.streamed_ctas, 0) << sms << " x " << bps;
      EXPECT_LE(PagedAttentionWorkspaceBytes(p, 32, dim),
                MaxPagedAttentionWorkspaceBytes(tokens, 32, 8, dim, 64, sms, bps));
    }
  }
}

}  // namespace
}  // namespace ballast::engine
