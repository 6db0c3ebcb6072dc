#include "engine/attention_plan.h"

#include <algorithm>

namespace ballast::engine {
namespace {

int64_t CeilDiv(int64_t a, int64_t b) { return (a + b - 1) / b; }

// Blocks a token takes: one per KV head and group of kAttentionMaxGroup
// query heads.
int64_t BlocksPerToken(int num_heads, int num_kv_heads) {
  const int group = num_heads / std::max(num_kv_heads, 1);
  return std::max<int64_t>(
      1, static_cast<int64_t>(num_kv_heads) * CeilDiv(std::max(group, 1), kAttentionMaxGroup));
}

// The smallest power of two at least `n` and kMinSplitTokens: at most
// twice a share, and few distinct lengths, since a CUDA graph is captured
// per length.
int RoundPartition(int64_t n) {
  int64_t p = kMinSplitTokens;
  while (p < n) p *= 2;
  return static_cast<int>(p);
}

// The few-blocks rule's partitions before rounding their length: as many
// as fit the `slots` in one wave (all blocks start at once, and none waits
// for a slot behind a block of the same length), and no context up to
// max_context is cut into more (FillDevice). A second, partial wave cost
// more than the fewer partitions did on an H100 (batches 8-24 at context
// 1,024: 0.6-1.8% of a step; docs/benchmarks.md, session 62).
int64_t FillDeviceParts(int64_t blocks, int max_context, int64_t slots) {
  const int64_t fit = slots / std::max<int64_t>(blocks, 1);
  return std::max<int64_t>(1, std::min(fit, CeilDiv(max_context, kMinPartitionTokens)));
}

AttentionPlan Unsplit(int max_context) {
  AttentionPlan p;
  p.partition_tokens = max_context;
  return p;
}

// Few blocks: every context cut into as many partitions as the slots hold
// in one wave, of at least kMinPartitionTokens keys.
AttentionPlan FillDevice(int64_t blocks, int num_tokens, int max_context, int64_t slots) {
  if (max_context <= kMinPartitionTokens) return Unsplit(max_context);
  const int64_t parts = FillDeviceParts(blocks, max_context, slots);
  int64_t len = CeilDiv(max_context, parts);
  len = CeilDiv(len, kMinPartitionTokens) * kMinPartitionTokens;
  AttentionPlan p;
  p.partition_tokens = static_cast<int>(len);
  p.num_partitions = static_cast<int>(CeilDiv(max_context, len));
  p.workspace_rows = p.num_partitions > 1 ? num_tokens : 0;
  return p;
}

// The stream plan, where the launch has enough chunks to share out:
// every resident block of one wave takes an equal run of them. The chunk
// count is bounded from the contexts' sum (each unit's last chunk may be
// partial); past int's range the partitioned rules plan instead.
bool StreamFits(const AttentionWork& work, int64_t per_token, int64_t slots, int64_t ctas) {
  if (ctas <= 0 || work.total_context <= 0) return false;
  const int64_t attended = work.attended_tokens > 0 ? work.attended_tokens : work.num_tokens;
  const double waves = static_cast<double>(attended * per_token) / static_cast<double>(slots);
  if (waves <= 1.0 || waves > kMaxStreamWaves) return false;
  const int64_t most =
      per_token * (CeilDiv(work.total_context, kAttentionStreamChunk) + work.num_tokens);
  const int64_t least = per_token * CeilDiv(work.total_context, kAttentionStreamChunk);
  return least >= ctas * kMinStreamChunksPerBlock && most * ctas < (int64_t{1} << 62) &&
         most <= 0x7fffffff;
}

}  // namespace

AttentionPlan PlanPagedAttention(const AttentionWork& work, int num_sms, int blocks_per_sm) {
  const int max_context = std::max(work.max_context, 1);
  const int T = std::max(work.num_tokens, 0);
  const int64_t per_token = BlocksPerToken(work.num_heads, work.num_kv_heads);
  const int64_t blocks = T * per_token;
  num_sms = std::max(num_sms, 1);
  const int64_t slots = static_cast<int64_t>(std::max(blocks_per_sm, 1)) * num_sms;
  if (T == 0) return Unsplit(max_context);
  if (blocks < 2L * num_sms) return FillDevice(blocks, T, max_context, slots);
  const int64_t ctas =
      static_cast<int64_t>(std::min(std::max(work.stream_blocks_per_sm, 0), blocks_per_sm)) *
      num_sms;
  if (StreamFits(work, per_token, slots, ctas)) {
    AttentionPlan p = Unsplit(max_context);
    p.streamed_ctas = static_cast<int>(ctas);
    p.workspace_rows = T;
    return p;
  }
  // Many blocks: a balanced share of the keys for each resident block.
  // A context past twice the share would run on long after the rest; cut
  // the long ones into partitions of about the share. (Up to twice, the
  // merge and its launch cost more than the tail: 64 equal contexts of
  // about 1,040 cut at 1,024 took 2% longer, docs/benchmarks.md.) Fewer than
  // slots / per_token tokens can be longer than a partition (each holds
  // more than the share, and the shares add up to the total), which
  // bounds the workspace.
  if (work.total_context <= 0) return Unsplit(max_context);
  const int longest =
      work.longest_context > 0 ? std::min(work.longest_context, max_context) : max_context;
  const int64_t share = CeilDiv(work.total_context * per_token, slots);
  if (longest <= 2 * share) return Unsplit(max_context);
  int len = RoundPartition(share);
  while (CeilDiv(max_context, len) > kMaxSplitPartitions) len *= 2;
  if (len >= longest) return Unsplit(max_context);
  AttentionPlan p;
  p.partition_tokens = len;
  p.num_partitions = static_cast<int>(CeilDiv(max_context, len));
  p.workspace_rows = static_cast<int>(std::min<int64_t>(T, CeilDiv(slots, per_token)));
  return p;
}

int AttentionUnitsPerToken(int num_heads, int num_kv_heads) {
  return static_cast<int>(BlocksPerToken(num_heads, num_kv_heads));
}

AttentionPlan PlanPagedAttentionFixed(int num_tokens, int max_context, int partition_tokens) {
  AttentionPlan p;
  p.partition_tokens = static_cast<int>(
      std::max<int64_t>(1, CeilDiv(partition_tokens, kAttentionTile)) * kAttentionTile);
  p.num_partitions =
      static_cast<int>(std::max<int64_t>(1, CeilDiv(max_context, p.partition_tokens)));
  p.workspace_rows = p.num_partitions > 1 ? std::max(num_tokens, 0) : 0;
  return p;
}

namespace {

size_t StreamWorkspaceBytes(int64_t ctas, int head_dim) {
  return static_cast<size_t>(2 * ctas) * kAttentionMaxGroup * (head_dim + 2) * sizeof(float);
}

}  // namespace

size_t PagedAttentionWorkspaceBytes(const AttentionPlan& plan, int num_heads, int head_dim) {
  if (plan.streamed_ctas > 0) return StreamWorkspaceBytes(plan.streamed_ctas, head_dim);
  if (plan.num_partitions <= 1) return 0;
  const size_t partials =
      static_cast<size_t>(plan.workspace_rows) * num_heads * plan.num_partitions;
  return partials * (head_dim + 2) * sizeof(float);  // o [D], m, l
}

size_t MaxPagedAttentionWorkspaceBytes(int max_tokens, int num_heads, int num_kv_heads,
                                       int head_dim, int max_context, int num_sms,
                                       int blocks_per_sm) {
  const int64_t per_token = BlocksPerToken(num_heads, num_kv_heads);
  num_sms = std::max(num_sms, 1);
  const int64_t slots = static_cast<int64_t>(std::max(blocks_per_sm, 1)) * num_sms;
  size_t most = 0;
  // The few-blocks rule: t rows and FillDeviceParts partitions at most (a
  // shorter context may round to more partitions than the longest does,
  // never to more than that).
  for (int t = 1; t <= max_tokens && t * per_token < 2L * num_sms; ++t) {
    AttentionPlan p;
    p.workspace_rows = t;
    p.num_partitions =
        static_cast<int>(FillDeviceParts(t * per_token, std::max(max_context, 1), slots));
    most = std::max(most, PagedAttentionWorkspaceBytes(p, num_heads, head_dim));
  }
  // The balanced rule: its rows and partitions at their bounds.
  AttentionPlan b;
  b.workspace_rows = static_cast<int>(std::min<int64_t>(max_tokens, CeilDiv(slots, per_token)));
  b.num_partitions = static_cast<int>(
      std::min<int64_t>(kMaxSplitPartitions, CeilDiv(max_context, kMinSplitTokens)));
  most = std::max(most, PagedAttentionWorkspaceBytes(b, num_heads, head_dim));
  // The stream plan: its pieces (with the balanced rule's bound above for
  // Llama-3-8B on an H100 it adds nothing: 3.3 MB against 13).
  return std::max(most, StreamWorkspaceBytes(slots, head_dim));
}

}  // namespace ballast::engine
