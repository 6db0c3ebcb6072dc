// CudaExecutor's KV block copies to and from host memory (session KV
// tiering, engine/kv_tiers.h). A chunk's blocks are scattered over the KV
// arena but contiguous in the host chunk, so each piece of up to
// kStagingBytes moves with one DMA between the host and a device staging
// buffer, and one kernel scatters it into (or gathers it from) the blocks
// (LaunchBlockCopy). Imports run on the executor's stream, before the next
// step that reads the blocks; exports on a stream of their own, beside any
// started step (none writes the blocks they copy: Executor::CopyKvToHost),
// else after the stream's work. Pieces alternate between two staging buffers, so the host fills
// one piece's spans while the device copies the other; the call returns
// once every copy is done.
//
// Layer-wise loads (StartKvLoad) run on a second stream: runs of adjacent
// blocks of 256 KiB or more as one DMA straight into the blocks, shorter
// ones as staged pieces that never cross a layer; one event per layer: the step's layer
// l waits for its event on the device, so layer 0 computes while the rest
// load and the host never blocks. The load starts after the work already
// queued on the executor's stream (the blocks' earlier users); staged
// copies start after the last load (they share the staging buffers).
#include <cuda_runtime.h>

#include <algorithm>
#include <vector>

#include "absl/strings/str_cat.h"
#include "engine/cuda/cuda_executor.h"
#include "engine/cuda/cuda_status.h"

namespace ballast::engine::cuda {
namespace {
constexpr size_t kStagingBytes = 16u << 20;
constexpr int kMaxSpans = 4096;
}  // namespace

absl::Status CudaExecutor::InitKvStaging() {
  for (int b = 0; b < 2; ++b) {
    if (auto s = kv_staging_[b].Allocate(kStagingBytes, "KV staging"); !s.ok()) return s;
    if (auto s = kv_spans_[b].Allocate(kMaxSpans * sizeof(BlockSpan), "KV spans"); !s.ok()) {
      return s;
    }
    BALLAST_CUDA_RETURN(cudaMallocHost(&host_spans_[b], kMaxSpans * sizeof(BlockSpan)),
                        "pinned KV spans");
    BALLAST_CUDA_RETURN(cudaEventCreateWithFlags(&kv_done_[b], cudaEventDisableTiming), "event");
    workspace_bytes_ += static_cast<int64_t>(kv_staging_[b].bytes() + kv_spans_[b].bytes());
  }
  if (partition_) {  // their block-copy kernels stay on the partition's SMs too
    for (cudaStream_t* s : {&load_stream_, &export_stream_}) {
      auto made = partition_->NewStream(0);
      if (!made.ok()) return made.status();
      *s = *made;
    }
  } else {
    BALLAST_CUDA_RETURN(cudaStreamCreateWithFlags(&load_stream_, cudaStreamNonBlocking),
                        "KV load stream");
    BALLAST_CUDA_RETURN(cudaStreamCreateWithFlags(&export_stream_, cudaStreamNonBlocking),
                        "KV export stream");
  }
  BALLAST_CUDA_RETURN(cudaEventCreateWithFlags(&export_after_, cudaEventDisableTiming), "event");
  BALLAST_CUDA_RETURN(cudaEventCreateWithFlags(&load_after_, cudaEventDisableTiming), "event");
  layer_loaded_.assign(config_.num_hidden_layers, nullptr);
  for (cudaEvent_t& e : layer_loaded_) {
    BALLAST_CUDA_RETURN(cudaEventCreateWithFlags(&e, cudaEventDisableTiming), "event");
  }
  return ReserveLoadSpans(kMaxSpans);
}

absl::Status CudaExecutor::ReserveLoadSpans(size_t spans) {
  if (spans <= load_span_capacity_) return absl::OkStatus();
  const size_t n = std::max(spans, 2 * load_span_capacity_);
  if (load_host_spans_) cudaFreeHost(load_host_spans_);
  load_host_spans_ = nullptr;
  workspace_bytes_ -= static_cast<int64_t>(load_spans_.bytes());
  load_span_capacity_ = 0;
  if (auto s = load_spans_.Allocate(n * sizeof(BlockSpan), "KV load spans"); !s.ok()) return s;
  BALLAST_CUDA_RETURN(cudaMallocHost(&load_host_spans_, n * sizeof(BlockSpan)),
                      "pinned KV load spans");
  workspace_bytes_ += static_cast<int64_t>(load_spans_.bytes());
  load_span_capacity_ = n;
  return absl::OkStatus();
}

namespace {

// One queued operation of a layer-wise load, planned before any is issued
// (the spans' offsets must be final before they are uploaded).
struct LoadOp {
  enum Kind { kDma, kScatter, kDirect, kLayerDone } kind;
  int buf = 0;                    // staging buffer (kDma, kScatter)
  size_t at = 0;                  // kDma: staging offset; kScatter: first span
  size_t n = 0;                   // kDma, kDirect: bytes; kScatter: spans
  const uint8_t* host = nullptr;  // kDma, kDirect source
  size_t layer = 0;               // kLayerDone
  uint8_t* block = nullptr;       // kDirect destination
};

// Copies at least this long (runs of adjacent blocks) go straight from
// the pinned chunk into the blocks: one DMA, no staging and no kernel.
// Shorter ones are packed into the staging buffer and scattered.
constexpr size_t kDirectBytes = 256u << 10;

// Plans `load`'s pieces: per layer, long copies as direct DMAs, the rest
// as spans packed into a staging buffer of `staging` bytes (at most
// `max_spans` a piece), one DMA per run of adjacent host bytes, one scatter
// per piece, then the layer's event. Fills spans[] (block, offset, bytes)
// in order; returns the ops and sets *num_spans.
std::vector<LoadOp> PlanLoad(const LayerKvCopies& load, size_t layers, size_t staging,
                             size_t max_spans, BlockSpan* spans, size_t* num_spans) {
  std::vector<LoadOp> ops;
  size_t next = 0;
  int buf = 0;
  for (size_t l = 0; l < layers; ++l) {
    size_t first = next, fill = 0;
    auto flush_piece = [&] {
      if (next > first) {
        ops.push_back({LoadOp::kScatter, buf, first, next - first});
        buf ^= 1;
      }
      first = next;
      fill = 0;
    };
    if (l < load.layers.size()) {
      for (const KvBlockCopy& c : load.layers[l]) {
        if (c.bytes >= kDirectBytes) {
          ops.push_back({LoadOp::kDirect, 0, 0, c.bytes, c.host, 0, c.block});
          continue;
        }
        for (size_t off = 0; off < c.bytes; off += staging) {
          const size_t bytes = std::min(staging, c.bytes - off);
          if (fill + bytes > staging || next - first == max_spans) flush_piece();
          const uint8_t* src = c.host + off;
          LoadOp* last = ops.empty() ? nullptr : &ops.back();
          if (last && last->kind == LoadOp::kDma && last->buf == buf &&
              last->host + last->n == src && last->at + last->n == fill) {
            last->n += bytes;
          } else {
            ops.push_back({LoadOp::kDma, buf, fill, bytes, src});
          }
          spans[next++] = {c.block + off, fill, bytes};
          fill += bytes;
        }
      }
    }
    flush_piece();
    ops.push_back({LoadOp::kLayerDone, 0, 0, 0, nullptr, l});
  }
  *num_spans = next;
  return ops;
}

}  // namespace

absl::Status CudaExecutor::StartKvLoad(LayerKvCopies load) {
  BALLAST_CUDA_RETURN(cudaSetDevice(options_.device), "cudaSetDevice");
  const char* what = "layer-wise KV load";
  if (load.layers.size() > layer_loaded_.size()) {
    return absl::InvalidArgumentError("KV load has more layers than the model");
  }
  // The previous load's spans are read until it ends.
  BALLAST_CUDA_RETURN(cudaStreamSynchronize(load_stream_), what);
  load_pending_ = false;
  size_t spans = 0;
  for (const auto& layer : load.layers) {
    for (const KvBlockCopy& c : layer) spans += (c.bytes + kStagingBytes - 1) / kStagingBytes;
  }
  if (!ReserveLoadSpans(spans).ok()) {
    // No device memory for this many spans (they grow outside the
    // balloon's accounting): copy now, layer by layer, through the staged
    // path. Slower, but the step and its neighbours go on.
    for (const auto& layer : load.layers) {
      if (auto s = StagedKvCopy(layer, /*to_host=*/false); !s.ok()) return s;
    }
    return absl::OkStatus();
  }
  const std::vector<LoadOp> ops =
      PlanLoad(load, layer_loaded_.size(), kStagingBytes, kMaxSpans, load_host_spans_, &spans);
  BALLAST_CUDA_RETURN(cudaEventRecord(load_after_, stream_), what);
  BALLAST_CUDA_RETURN(cudaStreamWaitEvent(load_stream_, load_after_, 0), what);
  auto* dev = load_spans_.get<BlockSpan>();
  if (spans > 0) {
    BALLAST_CUDA_RETURN(cudaMemcpyAsync(dev, load_host_spans_, spans * sizeof(BlockSpan),
                                        cudaMemcpyHostToDevice, load_stream_),
                        what);
  }
  for (const LoadOp& op : ops) {
    unsigned char* staging = kv_staging_[op.buf].get<unsigned char>();
    switch (op.kind) {
      case LoadOp::kDma:
        BALLAST_CUDA_RETURN(
            cudaMemcpyAsync(staging + op.at, op.host, op.n, cudaMemcpyHostToDevice, load_stream_),
            what);
        break;
      case LoadOp::kScatter:
        BALLAST_CUDA_RETURN(LaunchBlockCopy(staging, dev + op.at, static_cast<int>(op.n),
                                            /*gather=*/false, load_stream_),
                            what);
        break;
      case LoadOp::kDirect:
        BALLAST_CUDA_RETURN(
            cudaMemcpyAsync(op.block, op.host, op.n, cudaMemcpyHostToDevice, load_stream_), what);
        break;
      case LoadOp::kLayerDone:
        BALLAST_CUDA_RETURN(cudaEventRecord(layer_loaded_[op.layer], load_stream_), what);
        break;
    }
  }
  load_pending_ = true;
  load_started_ = true;
  return absl::OkStatus();
}

absl::Status CudaExecutor::WaitKvLoad() {
  BALLAST_CUDA_RETURN(cudaSetDevice(options_.device), "cudaSetDevice");
  BALLAST_CUDA_RETURN(cudaStreamSynchronize(load_stream_), "layer-wise KV load");
  load_pending_ = false;
  return absl::OkStatus();
}

absl::Status CudaExecutor::StagedKvCopy(absl::Span<const KvBlockCopy> copies, bool to_host) {
  BALLAST_CUDA_RETURN(cudaSetDevice(options_.device), "cudaSetDevice");
  const char* what = to_host ? "KV copy to host" : "KV copy from host";
  // An export copies blocks no started step writes (Executor::CopyKvToHost),
  // so it waits for none: a step queued behind another (ahead steps) would
  // otherwise hold every finished session turn's export, and the step
  // thread with it. With none started it follows stream_'s work.
  cudaStream_t stream = to_host ? export_stream_ : stream_;
  if (to_host && started_ == 0) {
    BALLAST_CUDA_RETURN(cudaEventRecord(export_after_, stream_), what);
    BALLAST_CUDA_RETURN(cudaStreamWaitEvent(stream, export_after_, 0), what);
  }
  if (load_started_) {  // the staging buffers are the last load's until it ends
    BALLAST_CUDA_RETURN(cudaStreamWaitEvent(stream, layer_loaded_.back(), 0), what);
  }
  absl::Status st = QueueKvPieces(copies, to_host, stream, what);
  // On an error too: nothing queued may outlive the call (the staging
  // buffers go to the next copy or load, the host bytes to the caller).
  const cudaError_t synced = cudaStreamSynchronize(stream);
  if (st.ok() && synced != cudaSuccess) {
    BALLAST_CUDA_RETURN(synced, what);
  }
  return st;
}

absl::Status CudaExecutor::QueueKvPieces(absl::Span<const KvBlockCopy> copies, bool to_host,
                                         cudaStream_t stream, const char* what) {
  size_t i = 0;
  int buf = 0;  // alternates between the two staging buffers
  while (i < copies.size()) {
    const KvBlockCopy& first = copies[i];
    if (first.bytes > kStagingBytes) {  // larger than the staging: copy it alone
      BALLAST_CUDA_RETURN(to_host ? cudaMemcpyAsync(first.host, first.block, first.bytes,
                                                    cudaMemcpyDeviceToHost, stream)
                                  : cudaMemcpyAsync(first.block, first.host, first.bytes,
                                                    cudaMemcpyHostToDevice, stream),
                          what);
      ++i;
      continue;
    }
    // This buffer's previous piece must be done before its spans change.
    BALLAST_CUDA_RETURN(cudaEventSynchronize(kv_done_[buf]), what);
    BlockSpan* host_spans = host_spans_[buf];
    // One piece: copies whose host bytes follow each other.
    size_t total = 0;
    int n = 0;
    while (i + n < copies.size() && n < kMaxSpans) {
      const KvBlockCopy& c = copies[i + n];
      if (c.host != first.host + total || total + c.bytes > kStagingBytes) break;
      host_spans[n] = {c.block, total, c.bytes};
      total += c.bytes;
      ++n;
    }
    auto* spans = kv_spans_[buf].get<BlockSpan>();
    auto* staging = kv_staging_[buf].get<unsigned char>();
    BALLAST_CUDA_RETURN(
        cudaMemcpyAsync(spans, host_spans, n * sizeof(BlockSpan), cudaMemcpyHostToDevice, stream),
        what);
    if (to_host) {
      BALLAST_CUDA_RETURN(LaunchBlockCopy(staging, spans, n, /*gather=*/true, stream), what);
      BALLAST_CUDA_RETURN(
          cudaMemcpyAsync(first.host, staging, total, cudaMemcpyDeviceToHost, stream), what);
    } else {
      BALLAST_CUDA_RETURN(
          cudaMemcpyAsync(staging, first.host, total, cudaMemcpyHostToDevice, stream), what);
      BALLAST_CUDA_RETURN(LaunchBlockCopy(staging, spans, n, /*gather=*/false, stream), what);
    }
    BALLAST_CUDA_RETURN(cudaEventRecord(kv_done_[buf], stream), what);
    buf ^= 1;
    i += n;
  }
  return absl::OkStatus();
}

absl::Status CudaExecutor::CopyKvToHost(absl::Span<const KvBlockCopy> copies) {
  return StagedKvCopy(copies, /*to_host=*/true);
}

absl::Status CudaExecutor::CopyKvFromHost(absl::Span<const KvBlockCopy> copies) {
  return StagedKvCopy(copies, /*to_host=*/false);
}

absl::Status CudaExecutor::MoveKvBlocks(absl::Span<const KvBlockMove> moves) {
  if (moves.empty()) return absl::OkStatus();
  BALLAST_CUDA_RETURN(cudaSetDevice(options_.device), "cudaSetDevice");
  if (host_spans_[0] == nullptr) return absl::FailedPreconditionError("KV staging not initialised");
  // Through the staged copies' first span buffers (kMaxSpans, allocated at
  // Init; those copies return only once done, so they are free here).
  static_assert(sizeof(BlockMove) == sizeof(BlockSpan), "moves reuse the staged spans' buffers");
  auto* host = reinterpret_cast<BlockMove*>(host_spans_[0]);
  auto* dev = kv_spans_[0].get<BlockMove>();
  cudaError_t err = cudaSuccess;
  for (size_t at = 0; at < moves.size() && err == cudaSuccess; at += kMaxSpans) {
    const size_t n = std::min<size_t>(kMaxSpans, moves.size() - at);
    for (size_t i = 0; i < n; ++i) {
      const KvBlockMove& m = moves[at + i];
      host[i] = {m.from, m.to, m.bytes};
    }
    err = cudaMemcpyAsync(dev, host, n * sizeof(BlockMove), cudaMemcpyHostToDevice, stream_);
    if (err == cudaSuccess) err = LaunchBlockMove(dev, static_cast<int>(n), stream_);
    // The pinned spans are refilled next round, and the caller frees the
    // old blocks (or, on an error, the new ones) once this returns: wait
    // for what was queued, error or not.
    const cudaError_t synced = cudaStreamSynchronize(stream_);
    if (err == cudaSuccess) err = synced;
  }
  if (err != cudaSuccess) {
    return absl::InternalError(absl::StrCat("KV block moves: ", cudaGetErrorString(err)));
  }
  return absl::OkStatus();
}

}  // namespace ballast::engine::cuda
