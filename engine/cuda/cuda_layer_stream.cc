// CudaExecutor's parameter remapping: weight layers streamed through slots
// from a pinned host image (see cuda_executor.h and memory/remap_plan.h).
#include <algorithm>
#include <memory>

#include "absl/strings/str_cat.h"
#include "engine/cuda/cuda_executor.h"
#include "spdlog/spdlog.h"

namespace ballast::engine::cuda {
namespace {

// Records streamed layer k's timing event of `set` (CudaExecutor::reached_
// or copied_) on `s`. Under stream capture, set 1's, as an external record
// so that the graph keeps it as a node and every replay records it;
// otherwise set 0's, as a plain record. CUDA refuses the external flag
// outside capture; and on an H200 a plain record of an event that a graph
// also records failed ("illegal state"), hence two sets.
cudaError_t RecordTimed(const std::vector<cudaEvent_t> (&set)[2], int k, cudaStream_t s) {
  cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
  if (cudaError_t err = cudaStreamIsCapturing(s, &capture); err) return err;
  const auto i = static_cast<size_t>(k);
  return capture == cudaStreamCaptureStatusActive
             ? cudaEventRecordWithFlags(set[1][i], s, cudaEventRecordExternal)
             : cudaEventRecord(set[0][i], s);
}

// Milliseconds from `from` to `to` when both have completed; -1 otherwise
// (unfinished or never recorded: the pair is skipped, not waited for).
float ElapsedMs(cudaEvent_t from, cudaEvent_t to) {
  float ms = 0;
  if (cudaEventQuery(from) != cudaSuccess || cudaEventQuery(to) != cudaSuccess ||
      cudaEventElapsedTime(&ms, from, to) != cudaSuccess) {
    cudaGetLastError();
    return -1;
  }
  return ms;
}

}  // namespace

std::vector<LayerExtent> CudaExecutor::LayerExtents() const {
  std::vector<LayerExtent> out;
  for (int l = 0; l < config_.num_hidden_layers; ++l) out.push_back(weights_->layer_extent(l));
  return out;
}

absl::Status CudaExecutor::EnsureHostImage() {
  if (host_image_ && weight_stream_) return absl::OkStatus();
  // Built and checked before anything is kept, so a failure leaves none.
  std::shared_ptr<const PinnedWeights> image =
      std::dynamic_pointer_cast<const PinnedWeights>(options_.host_weights);
  if (!image) {
    auto img = weights_->SaveToHost(options_.host_arena);
    if (absl::IsResourceExhausted(img.status())) {
      // The node's arena is full of other models' copies: pin a new image
      // (which holds up the process's CUDA calls while it pins).
      spdlog::warn("{}; pinning {} MiB more for layer streaming", img.status().ToString(),
                   weights_->bytes() >> 20);
      img = weights_->SaveToHost(nullptr);
    }
    if (!img.ok()) return img.status();
    image = std::move(*img);
  }
  if (image->image_bytes() != weights_->bytes()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "host weight image has ", image->image_bytes(), " bytes, the device ", weights_->bytes()));
  }
  cudaStream_t stream = nullptr;
  BALLAST_CUDA_RETURN(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), "weight stream");
  std::atomic_store(&host_image_, std::move(image));  // KeepHostWeights may read it
  weight_stream_ = stream;
  return absl::OkStatus();
}

void CudaExecutor::DropGraphs() {
  for (auto& [key, g] : graphs_) cudaGraphExecDestroy(g);
  graphs_.clear();
}

absl::Status CudaExecutor::SetLayerStreaming(const memory::StreamingPlan& plan) {
  const int n = config_.num_hidden_layers;
  const int m = static_cast<int>(plan.streamed.size());
  if (plan.alpha > 0 && (plan.slots < 1 || m != plan.alpha + plan.slots || m > n ||
                         !std::is_sorted(plan.streamed.begin(), plan.streamed.end()) ||
                         plan.streamed.front() < 0 || plan.streamed.back() >= n)) {
    return absl::InvalidArgumentError(absl::StrCat("streaming plan for ", n,
                                                   " layers is malformed (alpha ", plan.alpha,
                                                   ", slots ", plan.slots, ", ", m, " streamed)"));
  }
  BALLAST_CUDA_RETURN(cudaSetDevice(options_.device), "cudaSetDevice");
  // What can fail comes first, so a failure leaves the old plan in force.
  if (plan.alpha > 0) {
    if (auto st = EnsureHostImage(); !st.ok()) return st;
  }
  auto grow = [](std::vector<cudaEvent_t>* v, size_t want, unsigned flags) -> cudaError_t {
    while (v->size() < want) {
      cudaEvent_t e = nullptr;
      if (cudaError_t err = cudaEventCreateWithFlags(&e, flags); err) return err;
      v->push_back(e);
    }
    return cudaSuccess;
  };
  const auto um = static_cast<size_t>(m);
  BALLAST_CUDA_RETURN(grow(&weight_loaded_, um, cudaEventDisableTiming), "streaming events");
  BALLAST_CUDA_RETURN(grow(&slot_free_, static_cast<size_t>(plan.slots), cudaEventDisableTiming),
                      "streaming events");
  for (int set = 0; set < 2; ++set) {  // reached_[set][m]: the step-end join
    BALLAST_CUDA_RETURN(grow(&reached_[set], um + 1, cudaEventDefault), "stall events");
    BALLAST_CUDA_RETURN(grow(&copied_[set], um, cudaEventDefault), "stall events");
  }
  BALLAST_CUDA_RETURN(cudaStreamSynchronize(stream_), "streaming plan");
  if (weight_stream_) BALLAST_CUDA_RETURN(cudaStreamSynchronize(weight_stream_), "streaming plan");
  HarvestStall();  // under the old plan's indices
  stall_set_ = -1;
  DropGraphs();  // they captured the old plan's addresses and copies
  stream_plan_ = {};
  stream_index_.clear();
  slot_layers_.clear();
  if (plan.alpha == 0) return absl::OkStatus();
  stream_index_.assign(static_cast<size_t>(n), -1);
  for (int k = 0; k < m; ++k) {
    const int layer = plan.streamed[static_cast<size_t>(k)];
    stream_index_[static_cast<size_t>(layer)] = k;
    // Layer k's tensors at slot k % slots: every layer is laid out alike,
    // so they sit at the same offsets from the slot's home layer.
    const int home = plan.streamed[static_cast<size_t>(k % plan.slots)];
    const ptrdiff_t delta = static_cast<ptrdiff_t>(weights_->layer_extent(home).offset) -
                            static_cast<ptrdiff_t>(weights_->layer_extent(layer).offset);
    slot_layers_.push_back(weights_->layer(layer).Shifted(delta));
  }
  stream_plan_ = plan;
  return absl::OkStatus();
}

absl::Status CudaExecutor::RestoreLayers(absl::Span<const int> layers) {
  if (layers.empty()) return absl::OkStatus();
  if (auto st = EnsureHostImage(); !st.ok()) return st;
  BALLAST_CUDA_RETURN(cudaSetDevice(options_.device), "cudaSetDevice");
  BALLAST_CUDA_RETURN(cudaStreamSynchronize(stream_), "restoring layers");
  for (int l : layers) {
    if (l < 0 || l >= config_.num_hidden_layers) {
      return absl::InvalidArgumentError(absl::StrCat("no layer ", l));
    }
    const LayerExtent e = weights_->layer_extent(l);
    BALLAST_CUDA_RETURN(
        host_image_->CopyToDevice(weights_->base() + e.offset, e.offset, e.bytes, weight_stream_),
        "restoring a layer");
  }
  BALLAST_CUDA_RETURN(cudaStreamSynchronize(weight_stream_), "restoring layers");
  return absl::OkStatus();
}

absl::StatusOr<double> CudaExecutor::MeasureLayerTransferSeconds() {
  if (auto st = EnsureHostImage(); !st.ok()) return st;
  BALLAST_CUDA_RETURN(cudaSetDevice(options_.device), "cudaSetDevice");
  BALLAST_CUDA_RETURN(cudaStreamSynchronize(stream_), "timing a layer copy");
  cudaEvent_t t0 = nullptr, t1 = nullptr;
  BALLAST_CUDA_RETURN(cudaEventCreate(&t0), "timing events");
  cudaError_t err = cudaEventCreate(&t1);
  // Layer 0 onto itself (the same bytes; layer 0 is never lent), three
  // times; the fastest is the link's rate.
  const LayerExtent e = weights_->layer_extent(0);
  float best = -1;
  for (int i = 0; i < 3 && err == cudaSuccess; ++i) {
    float ms = 0;
    if ((err = cudaEventRecord(t0, weight_stream_)) ||
        (err = host_image_->CopyToDevice(weights_->base() + e.offset, e.offset, e.bytes,
                                         weight_stream_)) ||
        (err = cudaEventRecord(t1, weight_stream_)) || (err = cudaEventSynchronize(t1)) ||
        (err = cudaEventElapsedTime(&ms, t0, t1))) {
      break;
    }
    best = best < 0 ? ms : std::min(best, ms);
  }
  cudaEventDestroy(t0);
  if (t1) cudaEventDestroy(t1);
  BALLAST_CUDA_RETURN(err, "timing a layer copy");
  return best / 1e3;
}

LayerStreamingStats CudaExecutor::streaming_stats() const {
  LayerStreamingStats s;
  s.streamed_bytes = streamed_bytes_.load(std::memory_order_relaxed);
  s.stall_seconds = static_cast<double>(stall_ns_.load(std::memory_order_relaxed)) * 1e-9;
  return s;
}

void CudaExecutor::HarvestStall() {
  if (stall_set_ < 0) return;
  const std::vector<cudaEvent_t>& reached = reached_[stall_set_];
  const std::vector<cudaEvent_t>& copied = copied_[stall_set_];
  stall_set_ = -1;
  const int slots = stream_plan_.slots;
  const int m = static_cast<int>(stream_plan_.streamed.size());
  double ms_total = 0;
  // Each streamed layer past the slots' homes: its copy ending after the
  // compute got there.
  for (int k = slots; k < m; ++k) ms_total += std::max(0.f, ElapsedMs(reached[k], copied[k]));
  // The step's end (StreamJoin) waits for the last of the homes' reloads.
  float join = 0;
  for (int s = 0; s < slots; ++s) join = std::max(join, ElapsedMs(reached[m], copied[s]));
  ms_total += join;
  stall_ns_.fetch_add(static_cast<int64_t>(ms_total * 1e6), std::memory_order_relaxed);
}

absl::StatusOr<const DeviceLayer*> CudaExecutor::StreamBefore(int l) {
  if (stream_index_.empty() || stream_index_[static_cast<size_t>(l)] < 0) {
    return &weights_->layer(l);
  }
  const int k = stream_index_[static_cast<size_t>(l)];
  // The first `slots` layers are in their homes when the step starts (the
  // previous step joined their copies, stream-ordered before this one).
  if (k >= stream_plan_.slots) {
    BALLAST_CUDA_RETURN(RecordTimed(reached_, k, stream_), "stall event");
    BALLAST_CUDA_RETURN(cudaStreamWaitEvent(stream_, weight_loaded_[static_cast<size_t>(k)], 0),
                        "streamed layer");
  }
  return &slot_layers_[static_cast<size_t>(k)];
}

absl::Status CudaExecutor::StreamAfter(int l) {
  if (stream_index_.empty() || stream_index_[static_cast<size_t>(l)] < 0) {
    return absl::OkStatus();
  }
  const int k = stream_index_[static_cast<size_t>(l)];
  const int slots = stream_plan_.slots;
  const int m = static_cast<int>(stream_plan_.streamed.size());
  const int slot = k % slots;
  const int next = k + slots < m ? k + slots : slot;  // past the end: the home layer again
  const auto sl = static_cast<size_t>(slot), nx = static_cast<size_t>(next);
  BALLAST_CUDA_RETURN(cudaEventRecord(slot_free_[sl], stream_), "slot free");
  BALLAST_CUDA_RETURN(cudaStreamWaitEvent(weight_stream_, slot_free_[sl], 0), "slot free");
  if (next != k) {  // else the slot's home layer was its only one this step: it is still there
    const LayerExtent home = weights_->layer_extent(stream_plan_.streamed[sl]);
    const LayerExtent src = weights_->layer_extent(stream_plan_.streamed[nx]);
    BALLAST_CUDA_RETURN(host_image_->CopyToDevice(weights_->base() + home.offset, src.offset,
                                                  src.bytes, weight_stream_),
                        "streaming a layer");
  }
  // The copy's end is timed before weight_loaded_ is recorded, so that the
  // waits on weight_loaded_ (the layer's, or StreamJoin's for a home)
  // join it: under capture, work after the last join is refused.
  BALLAST_CUDA_RETURN(RecordTimed(copied_, next, weight_stream_), "stall event");
  BALLAST_CUDA_RETURN(cudaEventRecord(weight_loaded_[nx], weight_stream_), "layer streamed");
  return absl::OkStatus();
}

absl::Status CudaExecutor::StreamJoin() {
  if (stream_index_.empty()) return absl::OkStatus();
  const int m = static_cast<int>(stream_plan_.streamed.size());
  BALLAST_CUDA_RETURN(RecordTimed(reached_, m, stream_), "stall event");
  for (int s = 0; s < stream_plan_.slots; ++s) {
    BALLAST_CUDA_RETURN(cudaStreamWaitEvent(stream_, weight_loaded_[static_cast<size_t>(s)], 0),
                        "streamed layers");
  }
  return absl::OkStatus();
}

}  // namespace ballast::engine::cuda
