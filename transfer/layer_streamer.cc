#include "transfer/layer_streamer.h"

#include "transfer/thread_name.h"

namespace ballast::transfer {

LayerStreamer::LayerStreamer(std::vector<int> streamed, int slots, int num_layers, CopyFn copy)
    : streamed_(std::move(streamed)),
      slots_(slots),
      index_(static_cast<size_t>(num_layers), -1),
      copy_(std::move(copy)) {
  for (size_t k = 0; k < streamed_.size(); ++k) index_[static_cast<size_t>(streamed_[k])] = k;
  absl::MutexLock lock(&mu_);
  holds_.resize(static_cast<size_t>(slots_));
  for (int s = 0; s < slots_; ++s) holds_[static_cast<size_t>(s)] = s;
  thread_ = std::thread([this] {
    NameThisThread("layer-stream");
    Loop();
  });
}

LayerStreamer::~LayerStreamer() {
  WaitIdle();
  {
    absl::MutexLock lock(&mu_);
    stop_ = true;
  }
  thread_.join();
}

int LayerStreamer::Acquire(int layer) {
  const int k = index_[static_cast<size_t>(layer)];
  if (k < 0) return -1;
  const int slot = k % slots_;
  absl::MutexLock lock(&mu_);
  auto ready = [this, slot, k]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return holds_[static_cast<size_t>(slot)] == k;
  };
  if (!ready()) {
    const absl::Time t0 = absl::Now();
    mu_.Await(absl::Condition(&ready));
    stats_.stall_seconds += absl::ToDoubleSeconds(absl::Now() - t0);
  }
  return slot;
}

void LayerStreamer::Release(int layer) {
  const int k = index_[static_cast<size_t>(layer)];
  if (k < 0) return;
  const int m = static_cast<int>(streamed_.size());
  const int slot = k % slots_;
  const int next = k + slots_ < m ? k + slots_ : slot;
  // The slot's home layer was its only one this pass (fewer remapped
  // layers than slots): it still holds it, nothing to copy.
  if (next == k) return;
  absl::MutexLock lock(&mu_);
  holds_[static_cast<size_t>(slot)] = -1;
  queue_.emplace_back(slot, next);
}

void LayerStreamer::WaitIdle() {
  absl::MutexLock lock(&mu_);
  auto idle = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return queue_.empty() && !copying_; };
  mu_.Await(absl::Condition(&idle));
}

LayerStreamerStats LayerStreamer::stats() const {
  absl::MutexLock lock(&mu_);
  return stats_;
}

void LayerStreamer::Loop() {
  for (;;) {
    std::pair<int, int> job;
    {
      absl::MutexLock lock(&mu_);
      auto work = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return !queue_.empty() || stop_; };
      mu_.Await(absl::Condition(&work));
      if (queue_.empty()) return;  // stop_
      job = queue_.front();
      queue_.pop_front();
      copying_ = true;
    }
    copy_(job.first, streamed_[static_cast<size_t>(job.second)]);
    absl::MutexLock lock(&mu_);
    holds_[static_cast<size_t>(job.first)] = job.second;
    copying_ = false;
    ++stats_.copies;
  }
}

}  // namespace ballast::transfer
