// LayerStreamer: the control side of parameter remapping's weight
// streaming (Mirage §5.4; memory/remap_plan.h) for backends whose "device"
// is host memory (the CPU backend): one thread copies streamed layers from
// the host copy into their slots while the forward pass computes. It is
// the pipeline the CUDA backend builds from a copy stream and events, here
// testable without a GPU.
//
// The rule. Streamed layer k (index in `streamed`) always uses slot
// k % slots. When slot s's reader (layer streamed[k]) is done (Release),
// the copy of the slot's next layer is queued: streamed[k + slots], or
// streamed[s] again (the next pass's first) past the end; when that is the
// layer just read (a slot with no other layer: α < slots), nothing is
// copied. Copies run one
// at a time in the order queued (one copy engine). Acquire(layer) returns
// once the slot holds that layer. At construction slot s must already hold
// streamed[s] (its home), and after a whole pass it does again.
//
// Thread-safety: Acquire/Release/WaitIdle/stats from the executor's
// driving thread (one at a time); the copies run on the streamer's own
// thread. The destructor finishes the queued copies first.
#pragma once

#include <deque>
#include <functional>
#include <thread>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"

namespace ballast::transfer {

struct LayerStreamerStats {
  int64_t copies = 0;        // layer copies done
  double stall_seconds = 0;  // time Acquire waited for a copy (not hidden)
};

class LayerStreamer {
 public:
  // Copies layer `layer`'s weights from the host copy into slot `slot`.
  using CopyFn = std::function<void(int slot, int layer)>;
  // REQUIRES: 1 <= slots < streamed.size(), streamed ascending, each in
  // [0, num_layers).
  LayerStreamer(std::vector<int> streamed, int slots, int num_layers, CopyFn copy);
  ~LayerStreamer();
  LayerStreamer(const LayerStreamer&) = delete;
  LayerStreamer& operator=(const LayerStreamer&) = delete;

  // Before layer `layer` computes: -1 if it is resident (not streamed),
  // else its slot, once the slot holds it.
  int Acquire(int layer);
  // After layer `layer` computed (no-op if not streamed): queues the next
  // copy into its slot.
  void Release(int layer);
  // Returns once no copy is queued or running.
  void WaitIdle();
  LayerStreamerStats stats() const;

 private:
  void Loop();

  const std::vector<int> streamed_;
  const int slots_;
  std::vector<int> index_;  // layer -> k, or -1
  const CopyFn copy_;
  mutable absl::Mutex mu_;
  std::vector<int> holds_ ABSL_GUARDED_BY(mu_);  // slot -> k it holds, -1 while copying
  std::deque<std::pair<int, int>> queue_ ABSL_GUARDED_BY(mu_);  // (slot, k)
  bool copying_ ABSL_GUARDED_BY(mu_) = false;
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  LayerStreamerStats stats_ ABSL_GUARDED_BY(mu_);
  std::thread thread_;
};

}  // namespace ballast::transfer
