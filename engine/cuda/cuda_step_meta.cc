// CudaExecutor's step staging (split from cuda_executor.cc): checking a
// batch, choosing the step's shape (graph buckets, prefill tiles), and
// writing the tokens, sampling parameters, penalties and block table into
// the pinned step metadata, then uploading it. Host code on the step
// thread; the kernels that read it are enqueued by cuda_forward.cc.
#include <algorithm>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "engine/cuda/cuda_executor.h"
#include "engine/graph_buckets.h"

namespace ballast::engine::cuda {
namespace {

// Shorter chunks use the split-KV kernel (a 64-query tile would be mostly
// empty).
constexpr int kMinPrefillTileTokens = 16;

}  // namespace

absl::Status CudaExecutor::CheckChunk(size_t index, const SequenceChunk& ch) const {
  const int end = ch.start_pos + static_cast<int>(ch.tokens.size());
  if (ch.from_row >= 0 && (ch.tokens.size() != 1 || ch.from_row >= last_sampled_rows_)) {
    return absl::InvalidArgumentError(absl::StrCat("chunk ", index, " takes row ", ch.from_row,
                                                   " of a step that sampled ", last_sampled_rows_,
                                                   " rows (an ahead chunk is one token)"));
  }
  if (ch.kv->capacity_tokens(kv_->layout().block_tokens) < end) {
    return absl::InternalError(absl::StrCat("chunk ", index, ": KV capacity below position ", end));
  }
  if (end > options_.max_context) {
    return absl::InvalidArgumentError(absl::StrCat("chunk ", index, " reaches position ", end,
                                                   "; the executor was sized for ",
                                                   options_.max_context));
  }
  for (int id : ch.tokens) {
    if (ch.from_row >= 0) break;  // a placeholder
    if (id < 0 || id >= config_.vocab_size) {
      return absl::InvalidArgumentError(absl::StrCat("token id ", id, " outside the vocabulary"));
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<CudaExecutor::StepShape> CudaExecutor::Shape(absl::Span<const SequenceChunk> batch,
                                                            size_t num_sampling,
                                                            bool sample) const {
  const int Tmax = options_.max_batch_tokens, BT = kv_->layout().block_tokens;
  StepShape sh;
  sh.sample = sample;
  int need_blocks = 0;
  // A pending layer-wise load is waited for inside the step: not captured.
  bool decode_only = options_.cuda_graphs && !load_pending_;
  for (size_t b = 0; b < batch.size(); ++b) {
    const SequenceChunk& ch = batch[b];
    if (auto s = CheckChunk(b, ch); !s.ok()) return s;
    const int n = static_cast<int>(ch.tokens.size());
    const int end = ch.start_pos + n;
    sh.tokens += n;
    sh.max_context = std::max(sh.max_context, end);
    need_blocks = std::max(need_blocks, (end + BT - 1) / BT);
    if (n != 1 || ch.logits != LogitsMode::kLast) decode_only = false;
    sh.real_rows += ch.logits == LogitsMode::kAll ? n : ch.logits == LogitsMode::kLast && n > 0;
  }
  if (sh.tokens > Tmax) {
    return absl::InvalidArgumentError(
        absl::StrCat("step of ", sh.tokens, " tokens; the executor was sized for ", Tmax));
  }
  if (sample && num_sampling != static_cast<size_t>(sh.real_rows)) {
    return absl::InvalidArgumentError(
        absl::StrCat(num_sampling, " sampling entries for ", sh.real_rows, " rows"));
  }
  sh.graph = decode_only && sh.tokens > 0;
  if (sh.graph) {  // buckets: one captured graph serves many steps
    sh.tokens = std::min(GraphBucketTokens(sh.tokens), Tmax);
    sh.max_blocks = std::min(NextPow2(need_blocks), max_table_blocks_);
    sh.max_context = std::min(sh.max_blocks * BT, options_.max_context);
    sh.seqs = sh.tokens;
    sh.rows = sh.tokens;
  } else {
    sh.max_blocks = std::max(need_blocks, 1);
    sh.seqs = static_cast<int>(batch.size());
    sh.rows = sh.real_rows;
  }
  if (sh.seqs > max_rows_ || sh.rows > max_rows_) {
    return absl::InvalidArgumentError(absl::StrCat("step of ", sh.seqs,
                                                   " sequences; the executor "
                                                   "was sized for ",
                                                   max_rows_, " (max_seqs)"));
  }
  return sh;
}

void CudaExecutor::WriteTokens(absl::Span<const SequenceChunk> batch, StepShape* sh) {
  const int Tmax = options_.max_batch_tokens;
  auto* base = static_cast<uint8_t*>(host_meta_);
  int* tok = reinterpret_cast<int*>(base);
  int* seq = tok + Tmax;
  int* pos = seq + Tmax;
  int* rows = pos + Tmax;
  int* pos_small = rows + Tmax;
  int* from_row = pos_small + Tmax;
  auto* tiles = reinterpret_cast<PrefillTile*>(base + tiles_offset_);
  int t = 0, r = 0;
  for (size_t b = 0; b < batch.size(); ++b) {
    const SequenceChunk& ch = batch[b];
    const int n = static_cast<int>(ch.tokens.size());
    // Chunks of many tokens go to the tensor-core prefill kernel.
    const bool flash = prefill_kernel_ok_ && n >= kMinPrefillTileTokens;
    if (flash) {
      for (int j = 0; j < n; j += kPrefillTileTokens) {
        PrefillTile& tile = tiles[sh->prefill_tiles++];
        tile.first_token = t + j;
        tile.n = std::min(kPrefillTileTokens, n - j);
        tile.seq = static_cast<int>(b);
        tile.pos0 = ch.start_pos + j;
      }
    }
    sh->resolve |= ch.from_row >= 0;
    for (int i = 0; i < n; ++i, ++t) {
      tok[t] = ch.from_row >= 0 ? 0 : ch.tokens[i];  // an ahead token: set on the device
      from_row[t] = ch.from_row;
      seq[t] = static_cast<int>(b);
      pos[t] = ch.start_pos + i;
      pos_small[t] = flash ? -1 : pos[t];
      sh->small_tokens += !flash;
      if (!flash) {
        sh->small_context += pos[t] + 1;
        sh->small_longest = std::max(sh->small_longest, pos[t] + 1);
      }
      if (ch.logits == LogitsMode::kAll || (ch.logits == LogitsMode::kLast && i == n - 1))
        rows[r++] = t;
    }
  }
  for (; t < sh->tokens; ++t) {  // graph padding
    tok[t] = 0;
    seq[t] = 0;
    pos[t] = -1;
    pos_small[t] = -1;
    from_row[t] = -1;
    rows[r++] = t;
  }
  WriteAttentionOrder(pos_small, sh->tokens, from_row + Tmax);
}

// The split-KV attention's token order (TokenMap::order): the longest
// contexts first, the tokens it skips (pos_small -1) last. Its blocks run
// in about this order, so the longest start first and the short ones fill
// the end, where a long one started last would run alone (largest
// processing time first). Ties keep token order. The skipped tokens are
// set apart first, so a prefill step (mostly tile tokens) sorts few.
void CudaExecutor::WriteAttentionOrder(const int* pos_small, int tokens, int* order) {
  int attended = 0;
  for (int t = 0; t < tokens; ++t) {
    if (pos_small[t] >= 0) order[attended++] = t;
  }
  for (int t = 0, next = attended; t < tokens; ++t) {
    if (pos_small[t] < 0) order[next++] = t;
  }
  std::stable_sort(order, order + attended,
                   [pos_small](int a, int b) { return pos_small[a] > pos_small[b]; });
}

AttentionPlan CudaExecutor::PlanAttention(const StepShape& sh) const {
  if (options_.deterministic) {
    return PlanPagedAttentionFixed(sh.tokens, sh.max_context, fixed_partition_tokens_);
  }
  AttentionWork w;
  w.num_tokens = sh.tokens;
  w.num_heads = config_.num_attention_heads;
  w.num_kv_heads = config_.num_key_value_heads;
  w.max_context = sh.max_context;
  w.total_context = sh.small_context;
  w.longest_context = sh.small_longest;
  w.attended_tokens = sh.small_tokens;
  w.stream_blocks_per_sm = attention_stream_blocks_per_sm_;
  return PlanPagedAttention(w, num_sms_, attention_blocks_per_sm_);
}

void CudaExecutor::WriteAttentionStream(const StepShape& sh) {
  const int ctas = sh.attention.streamed_ctas;
  if (ctas <= 0) return;
  const int Tmax = options_.max_batch_tokens;
  auto* base = static_cast<uint8_t*>(host_meta_);
  const int* pos_small = reinterpret_cast<const int*>(base) + 4 * Tmax;
  const int* order = pos_small + 2 * Tmax;
  WriteAttentionStreamStarts(
      sh.tokens, [&](int s) { return pos_small[order[s]] + 1; },
      AttentionUnitsPerToken(config_.num_attention_heads, config_.num_key_value_heads), ctas,
      reinterpret_cast<AttentionStreamStart*>(base + stream_offset_));
}

absl::Status CudaExecutor::ReservePenalties(size_t entries) {
  if (entries <= penalty_capacity_) return absl::OkStatus();
  size_t cap = std::max<size_t>(penalty_capacity_, 1024);
  while (cap < entries) cap *= 2;
  // Steps end with a sync, so nothing in flight uses the old buffers; the
  // graphs that sample captured the old address.
  BALLAST_CUDA_RETURN(cudaStreamSynchronize(stream_), "penalty buffer");
  for (auto it = graphs_.begin(); it != graphs_.end();) {
    if (std::get<2>(it->first)) {
      cudaGraphExecDestroy(it->second);
      it = graphs_.erase(it);
    } else {
      ++it;
    }
  }
  DeviceBuffer fresh;
  if (auto s = fresh.Allocate(cap * sizeof(SamplePenalty), "penalty entries"); !s.ok()) return s;
  void* host = nullptr;
  BALLAST_CUDA_RETURN(cudaMallocHost(&host, cap * sizeof(SamplePenalty)), "pinned penalty entries");
  if (host_penalties_) cudaFreeHost(host_penalties_);
  host_penalties_ = host;
  penalties_ = std::move(fresh);
  workspace_bytes_ += static_cast<int64_t>((cap - penalty_capacity_) * sizeof(SamplePenalty));
  penalty_capacity_ = cap;
  return absl::OkStatus();
}

absl::Status CudaExecutor::WriteSampleParams(absl::Span<const DeviceSampling> sampling,
                                             const StepShape& sh) {
  static_assert(kSampleMaxTop == kMaxTopLogprobs);
  size_t entries = 0;
  for (int i = 0; sh.sample && i < sh.real_rows; ++i) {
    if (sampling[i].options.has_penalties()) entries += sampling[i].penalties.size();
  }
  if (auto s = ReservePenalties(entries); !s.ok()) return s;
  auto* params =
      reinterpret_cast<SampleParams*>(static_cast<uint8_t*>(host_meta_) + params_offset_);
  auto* pen = static_cast<SamplePenalty*>(host_penalties_);
  int next = 0;
  for (int i = 0; i < sh.rows; ++i) {
    SampleParams p;  // defaults for padding rows and for steps that return logits
    if (sh.sample && i < sh.real_rows) {
      const DeviceSampling& s = sampling[i];
      const SamplingOptions& o = s.options;
      p.temperature = o.temperature;
      p.top_p = o.top_p;
      p.top_k = o.top_k;
      p.min_p = o.min_p;
      p.presence_penalty = o.presence_penalty;
      p.frequency_penalty = o.frequency_penalty;
      p.repetition_penalty = o.repetition_penalty;
      p.top_logprobs = std::min(o.top_logprobs, kSampleMaxTop);
      p.seed = s.seed;
      p.counter = s.counter;
      if (o.has_penalties()) {
        p.penalty_begin = next;
        p.penalty_count = static_cast<int>(s.penalties.size());
        for (const PenaltyEntry& e : s.penalties) {
          pen[next++] = {e.token, e.output_count, e.in_prompt, 0.0f};
        }
      }
    }
    params[i] = p;
  }
  if (next > 0) {
    BALLAST_CUDA_RETURN(
        cudaMemcpyAsync(penalties_.get(), host_penalties_, next * sizeof(SamplePenalty),
                        cudaMemcpyHostToDevice, stream_),
        "penalty upload");
  }
  return absl::OkStatus();
}

void CudaExecutor::WriteBlockTable(absl::Span<const SequenceChunk> batch, const StepShape& sh) {
  int* table = reinterpret_cast<int*>(static_cast<uint8_t*>(host_meta_) + table_offset_);
  for (int l = 0; l < config_.num_hidden_layers; ++l) {
    for (size_t b = 0; b < batch.size(); ++b) {
      const auto& ids = batch[b].kv->blocks[l];
      const size_t n = std::min(ids.size(), static_cast<size_t>(sh.max_blocks));
      std::memcpy(table + (static_cast<size_t>(l) * sh.seqs + b) * sh.max_blocks, ids.data(),
                  n * sizeof(int));
    }
  }
}

absl::Status CudaExecutor::Upload(const StepShape& sh) {
  auto* base = static_cast<uint8_t*>(host_meta_);
  BALLAST_CUDA_RETURN(
      cudaMemcpyAsync(meta_.get(), host_meta_, params_offset_ + sh.rows * sizeof(SampleParams),
                      cudaMemcpyHostToDevice, stream_),
      "step upload");
  if (sh.prefill_tiles > 0) {
    BALLAST_CUDA_RETURN(
        cudaMemcpyAsync(meta_.get<uint8_t>() + tiles_offset_, base + tiles_offset_,
                        sh.prefill_tiles * sizeof(PrefillTile), cudaMemcpyHostToDevice, stream_),
        "prefill tile upload");
  }
  const size_t table_bytes =
      static_cast<size_t>(config_.num_hidden_layers) * sh.seqs * sh.max_blocks * sizeof(int);
  BALLAST_CUDA_RETURN(cudaMemcpyAsync(meta_.get<uint8_t>() + table_offset_, base + table_offset_,
                                      table_bytes, cudaMemcpyHostToDevice, stream_),
                      "block table upload");
  return absl::OkStatus();
}

absl::StatusOr<CudaExecutor::StepShape> CudaExecutor::Stage(
    absl::Span<const SequenceChunk> batch, absl::Span<const DeviceSampling> sampling, bool sample) {
  auto sh = Shape(batch, sampling.size(), sample);
  if (!sh.ok()) return sh.status();
  WriteTokens(batch, &*sh);
  sh->attention = PlanAttention(*sh);
  WriteAttentionStream(*sh);
  last_attention_plan_ = sh->attention;
  if (auto s = WriteSampleParams(sampling, *sh); !s.ok()) return s;
  WriteBlockTable(batch, *sh);
  if (auto s = Upload(*sh); !s.ok()) return s;
  return sh;
}

}  // namespace ballast::engine::cuda
