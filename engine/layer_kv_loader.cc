#include "engine/layer_kv_loader.h"

#include <utility>

#include "transfer/thread_name.h"

namespace ballast::engine {

LayerKvLoader::LayerKvLoader(CopyFn copy) : copy_(std::move(copy)) {}

LayerKvLoader::~LayerKvLoader() {
  {
    absl::MutexLock lock(&mu_);
    auto idle = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return !active_; };
    mu_.Await(absl::Condition(&idle));
    stop_ = true;
  }
  if (thread_.joinable()) thread_.join();
}

void LayerKvLoader::Start(LayerKvCopies load) {
  WaitAll();
  {
    absl::MutexLock lock(&mu_);
    load_ = std::move(load);
    done_layers_ = 0;
    active_ = !load_.layers.empty();
  }
  if (!thread_.joinable()) {
    thread_ = std::thread([this] {
      transfer::NameThisThread("kv-layer-load");
      Loop();
    });
  }
}

void LayerKvLoader::WaitLayer(int layer) {
  absl::MutexLock lock(&mu_);
  auto ready = [this, layer]()
                   ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return !active_ || done_layers_ > layer; };
  mu_.Await(absl::Condition(&ready));
}

void LayerKvLoader::WaitAll() {
  absl::MutexLock lock(&mu_);
  auto idle = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return !active_; };
  mu_.Await(absl::Condition(&idle));
}

bool LayerKvLoader::pending() const {
  absl::MutexLock lock(&mu_);
  return active_;
}

void LayerKvLoader::Loop() {
  for (;;) {
    absl::Span<const KvBlockCopy> layer;
    {
      absl::MutexLock lock(&mu_);
      auto work = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return active_ || stop_; };
      mu_.Await(absl::Condition(&work));
      if (!active_) return;  // stop_
      // load_ does not change while active_: the span stays valid unlocked.
      layer = load_.layers[done_layers_];
    }
    copy_(layer);
    absl::MutexLock lock(&mu_);
    if (++done_layers_ == static_cast<int>(load_.layers.size())) {
      active_ = false;
      load_.layers.clear();
    }
  }
}

}  // namespace ballast::engine
