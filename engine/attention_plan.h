// The split-KV decode attention's launch plan (engine/cuda/paged_attention.cuh:
// the tensor-core and CUDA-core kernels share it):
// how many partitions each (token, KV head) pair's keys are cut into, and
// how much workspace their partial results need. Pure host arithmetic, kept
// apart from the kernels (as FlashInfer splits plan from run) so the CPU
// unit tests check it and the CUDA executor sizes its workspace from it.
// Stateless functions: safe from any thread.
//
// The kernel gives each (token, KV head, group of up to kAttentionMaxGroup
// query heads, partition) a block of 128 threads.
// Every partition has partition_tokens keys; a token whose context is at
// most partition_tokens is not split: its one block writes the output, and
// its other partitions' blocks return at once. A split token's partitions
// write partial results to the workspace, and a merge kernel combines them.
//
// Three rules choose the plan (PlanPagedAttention):
// - Few blocks (under two per SM): split every context into as many
//   partitions as start in one wave of the kernel's resident blocks, so a
//   small batch fills the device.
// - Many blocks: when the longest context is past twice a balanced share
//   of the step's keys, split the contexts longer than about that share.
//   With spread contexts, one long sequence's blocks would otherwise run
//   long after the rest, the SMs mostly idle.
// - Many blocks, where the kernel can stream (AttentionWork::
//   stream_blocks_per_sm) and the unsplit grid would leave its second
//   wave less than half full: the stream plan. The grid is one wave of the
//   stream kernel's resident blocks (streamed_ctas), and the launch's keys,
//   in chunks of
//   kAttentionStreamChunk, are shared out equally among them: block b
//   takes chunks [b N / C, (b + 1) N / C) of the N chunks of every
//   (token, KV head, head group) unit laid end to end in the launch's
//   order, so every SM reads the same number of bytes whatever the
//   contexts (one and a third waves of equal blocks left the SMs idle 29%
//   of a batch-64 launch on an H100). Each switch between units costs the
//   block a restart of its copies, so where the unsplit grid's waves are
//   fuller the partitioned rules plan (on an H100 the stream plan was
//   1.3% faster a step at 1.29 waves of equal contexts and 2.3-3% slower
//   at 0.97, 1.94, 2.59 and 5.17; docs/benchmarks.md, session 63). A unit
//   cut between blocks is merged
//   from its pieces by the last block to finish one; a block that holds a
//   whole unit writes the output. WriteAttentionStreamStarts gives each
//   block its first unit.
#pragma once

#include <cstddef>
#include <cstdint>

namespace ballast::engine {

// The fixed plan's partitions are multiples of this (a multiple of both
// kernels' keys per round of their warps).
inline constexpr int kAttentionTile = 128;
// The few-blocks rule's shortest partition.
inline constexpr int kMinPartitionTokens = 64;
// The balanced rule's shortest partition: shorter ones would merge more
// than they save.
inline constexpr int kMinSplitTokens = 256;
// The balanced rule's most partitions a token (bounds the workspace).
inline constexpr int kMaxSplitPartitions = 16;
// Query heads per block of the kernel (larger GQA groups take several).
inline constexpr int kAttentionMaxGroup = 8;
// Blocks of the attention kernel resident per SM that a caller without a
// GPU assumes (the simulator's workspace estimate): the CUDA-core
// kernel's 4 on sm_90. The executor plans with its own kernel's figure
// (the occupancy API: PagedAttentionBlocksPerSm in engine/cuda/kernels.h),
// which for the tensor-core kernel that serves most shapes is 3 at head
// sizes 80-128 (68 KB of shared memory) and 5 at 64. The workspace grows
// with the figure, so an estimate made with 4 is a few MB over the
// executor's at 80-128 and a few MB under at 64.
inline constexpr int kAttentionBlocksPerSm = 4;
// Keys a chunk of the stream plan: the tensor-core kernel's keys a warp
// stages at a time.
inline constexpr int kAttentionStreamChunk = 16;
// The stream plan's fewest chunks a block: below this the launch is too
// small to share out, and the other rules plan it.
inline constexpr int kMinStreamChunksPerBlock = 8;
// The stream plan is taken while the unsplit grid's attended blocks fill
// more than one wave of resident blocks and at most this many.
inline constexpr double kMaxStreamWaves = 1.5;

struct AttentionPlan {
  int num_partitions = 1;
  int partition_tokens = 0;  // keys a partition (> 0)
  // Token slots (positions in the launch's token order) whose partial
  // results the workspace holds: the first workspace_rows slots. A launch
  // whose order puts the split tokens (context > partition_tokens) first,
  // as the executor's longest-first order does, needs no more; with no
  // order it is every token.
  int workspace_rows = 0;
  // > 0: the stream plan (num_partitions 1): this many blocks share the
  // launch's key chunks equally, and workspace_rows is every token (a
  // unit cut between blocks counts its pieces' arrivals by token slot).
  int streamed_ctas = 0;
};

// Where block b of a stream plan starts: the order slot of the token
// whose units hold its first chunk, that slot's first chunk, and the
// launch's chunks in all (the same in every entry). Four ints, read by the
// kernel as an int4.
struct AttentionStreamStart {
  int slot = 0;
  int slot_chunk = 0;
  int total_chunks = 0;
  int unused = 0;
};

// What the planner knows of a launch.
struct AttentionWork {
  int num_tokens = 0;    // T: the launch's tokens, skipped ones included
  int num_heads = 0;     // query heads
  int num_kv_heads = 0;  // a divisor of num_heads
  // The grid's bound: no token's context (pos + 1) exceeds it. A graph
  // replays one plan for many steps, so this is its bucket's bound.
  int max_context = 0;
  // The sum of the tokens' contexts and the longest one, over the tokens
  // the kernel attends for (0: unknown; only the few-blocks rule applies).
  int64_t total_context = 0;
  int longest_context = 0;
  // Tokens the kernel attends for (the others, padding and tokens of
  // prefill tiles, make blocks that return at once); 0: num_tokens.
  int attended_tokens = 0;
  // > 0: the launch's kernel can run the stream plan (the tensor-core
  // kernel), keeping this many of its blocks resident an SM (at most
  // blocks_per_sm); 0: only the partitioned rules.
  int stream_blocks_per_sm = 0;
};

// The plan of a launch on `num_sms` SMs that each keep `blocks_per_sm` of
// the kernel's blocks resident (its slots: num_sms x blocks_per_sm). Few
// blocks (under two per SM): every context cut into as many partitions as
// fit the slots in one wave. Many: only the contexts past a balanced share
// of the keys per slot are cut. The balanced rule's split tokens must come
// first in the launch's order (workspace_rows).
AttentionPlan PlanPagedAttention(const AttentionWork& work, int num_sms, int blocks_per_sm);

// The batch-invariant plan (deterministic mode): partitions of a fixed
// length (partition_tokens rounded up to kAttentionTile), so a query's keys
// are reduced in the same tiles, partitions and order whatever else shares
// the step. Empty partitions add nothing to the merge, and a context of one
// partition is written directly, as the merge of it alone would write it
// bit for bit. Every one of `num_tokens` slots may be split.
AttentionPlan PlanPagedAttentionFixed(int num_tokens, int max_context, int partition_tokens);

// Bytes of workspace `plan` needs (0 when nothing is split). A stream
// plan's: two pieces a block (the end of one unit, the start of another),
// each kAttentionMaxGroup heads of head_dim + 2 floats.
size_t PagedAttentionWorkspaceBytes(const AttentionPlan& plan, int num_heads, int head_dim);

// Units (blocks of the partitioned kernel) a token makes: one per KV head
// and group of kAttentionMaxGroup query heads.
int AttentionUnitsPerToken(int num_heads, int num_kv_heads);

// The chunks a unit of a token with `context` keys (0: a token the kernel
// skips) holds.
inline int AttentionStreamChunks(int context) {
  return context > 0 ? (context + kAttentionStreamChunk - 1) / kAttentionStreamChunk : 0;
}

// The block that holds chunk j of a stream plan of `ctas` blocks over
// `total` chunks: the b with b total / ctas <= j < (b + 1) total / ctas.
inline int AttentionStreamBlockOf(int64_t j, int64_t total, int ctas) {
  return static_cast<int>(((j + 1) * ctas - 1) / total);
}

// Fills starts[0, ctas) for a stream plan over the tokens whose contexts,
// in the launch's order, are context_of_slot(0 .. num_slots - 1) (0: a
// skipped token), each making `units_per_token` units (KV heads times head
// groups). Returns the launch's chunks. A block with no chunks (fewer
// chunks than blocks, which PlanPagedAttention never plans) gets slot 0;
// the kernel returns at once for it, and counts only blocks with chunks.
template <typename ContextOfSlot>
int64_t WriteAttentionStreamStarts(int num_slots, ContextOfSlot context_of_slot,
                                   int units_per_token, int ctas, AttentionStreamStart* starts) {
  int64_t total = 0;
  for (int s = 0; s < num_slots; ++s) {
    total += static_cast<int64_t>(units_per_token) * AttentionStreamChunks(context_of_slot(s));
  }
  int slot = 0;
  int64_t slot_chunk = 0;  // chunks before `slot`
  for (int b = 0; b < ctas; ++b) {
    const int64_t first = total > 0 ? b * total / ctas : 0;
    // Past the slots that end at or before `first` (skipped ones too).
    while (slot < num_slots) {
      const int64_t n =
          static_cast<int64_t>(units_per_token) * AttentionStreamChunks(context_of_slot(slot));
      if (slot_chunk + n > first) break;
      slot_chunk += n;
      ++slot;
    }
    const bool any = slot < num_slots && total > 0;
    starts[b] = {any ? slot : 0, any ? static_cast<int>(slot_chunk) : 0, static_cast<int>(total),
                 0};
  }
  return total;
}

// The most workspace PlanPagedAttention(..., num_sms, blocks_per_sm) asks
// for over every launch of at most max_tokens tokens and contexts of at
// most max_context. It grows with blocks_per_sm.
size_t MaxPagedAttentionWorkspaceBytes(int max_tokens, int num_heads, int num_kv_heads,
                                       int head_dim, int max_context, int num_sms,
                                       int blocks_per_sm);

}  // namespace ballast::engine
