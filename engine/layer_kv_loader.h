// LayerKvLoader: layer-wise KV loading for backends whose KV cache is in
// host memory (the CPU backend's Executor::StartKvLoad). One thread copies a
// load's layers in order; the forward pass waits for layer l (WaitLayer)
// just before layer l touches the cache, so layer l computes while layer
// l + 1 loads. It is the control the CUDA backend implements with a copy
// stream and per-layer events, here testable without a GPU.
//
// Thread-safety: Start, WaitLayer, WaitAll and pending are called by the
// executor's driving thread (one at a time); the loader's own thread runs
// the copies. The destructor finishes the current load first.
#pragma once

#include <functional>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/types/span.h"
#include "engine/executor.h"

namespace ballast::engine {

class LayerKvLoader {
 public:
  // Copies one layer's blocks (for the CPU backend, memcpy).
  using CopyFn = std::function<void(absl::Span<const KvBlockCopy>)>;
  explicit LayerKvLoader(CopyFn copy);
  ~LayerKvLoader();
  LayerKvLoader(const LayerKvLoader&) = delete;
  LayerKvLoader& operator=(const LayerKvLoader&) = delete;

  // Starts copying `load`, layer 0 first; waits for an earlier load to end.
  // The loader's thread starts on the first call.
  void Start(LayerKvCopies load);
  // Returns once layer `layer`'s copies are done (at once with no load).
  void WaitLayer(int layer);
  // Returns once the whole load is done.
  void WaitAll();
  bool pending() const;

 private:
  void Loop();

  const CopyFn copy_;
  mutable absl::Mutex mu_;
  LayerKvCopies load_ ABSL_GUARDED_BY(mu_);
  int done_layers_ ABSL_GUARDED_BY(mu_) = 0;  // layers of load_ copied
  bool active_ ABSL_GUARDED_BY(mu_) = false;  // load_ is being copied
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  std::thread thread_;  // the driving thread's (started in Start)
};

}  // namespace ballast::engine
