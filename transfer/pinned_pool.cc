#include "transfer/pinned_pool.h"

#include <algorithm>
#include <cstdlib>
#include <new>
#include <utility>

#include "transfer/thread_name.h"

namespace ballast::transfer {
namespace {
constexpr size_t kPage = 4096;
}  // namespace

PinnedBufferPool::Buffer::~Buffer() {
  {
    absl::MutexLock lock(&mu);
    pin.reset();  // unpin first (this is the last owner of the handle)
  }
  std::free(data);
}

std::shared_ptr<PinnedBufferPool> PinnedBufferPool::Create(PinFn pin, size_t max_idle_bytes) {
  std::shared_ptr<PinnedBufferPool> pool(new PinnedBufferPool(std::move(pin), max_idle_bytes));
  if (pool->pin_) {
    pool->pinner_ = std::thread([p = pool.get()] {
      NameThisThread("pin-host");
      p->PinLoop();
    });
  }
  return pool;
}

PinnedBufferPool::PinnedBufferPool(PinFn pin, size_t max_idle_bytes)
    : pin_(std::move(pin)), max_idle_bytes_(max_idle_bytes) {}

PinnedBufferPool::~PinnedBufferPool() {
  {
    absl::MutexLock lock(&mu_);
    stop_ = true;
  }
  if (pinner_.joinable()) pinner_.join();
  absl::flat_hash_map<size_t, std::vector<std::shared_ptr<Buffer>>> idle;
  {
    absl::MutexLock lock(&mu_);
    idle.swap(idle_);
  }
  // `idle` goes here: each buffer unpinned, then freed.
}

std::unique_ptr<KvChunk> PinnedBufferPool::NewChunk(const KvChunkMeta& meta) {
  const size_t bytes = (std::max<size_t>(meta.payload_bytes(), 1) + kPage - 1) / kPage * kPage;
  std::shared_ptr<Buffer> b;
  {
    absl::MutexLock lock(&mu_);
    auto it = idle_.find(bytes);
    if (it != idle_.end() && !it->second.empty()) {
      b = std::move(it->second.back());
      it->second.pop_back();
      stats_.idle_bytes -= static_cast<int64_t>(bytes);
      ++stats_.reused;
    } else {
      ++stats_.allocated;
    }
  }
  if (!b) {
    auto* data = static_cast<uint8_t*>(std::aligned_alloc(kPage, bytes));
    if (data == nullptr) throw std::bad_alloc();
    b = std::make_shared<Buffer>(data, bytes);
    if (pin_) {
      absl::MutexLock lock(&mu_);
      to_pin_.push_back(b);
    }
  }
  auto c = std::make_unique<KvChunk>();
  c->meta = meta;
  std::weak_ptr<PinnedBufferPool> pool = weak_from_this();
  PayloadFree release;
  release.recycle = [pool, b](uint8_t*) mutable {
    if (auto p = pool.lock()) p->Return(std::move(b));
    b.reset();  // no pool (or over its cap): unpinned and freed with the last owner
  };
  c->payload = std::unique_ptr<uint8_t[], PayloadFree>(b->data, std::move(release));
  return c;
}

void PinnedBufferPool::Return(std::shared_ptr<Buffer> b) {
  absl::MutexLock lock(&mu_);
  if (stats_.idle_bytes + static_cast<int64_t>(b->bytes) > static_cast<int64_t>(max_idle_bytes_)) {
    return;  // `b` goes with this call (outside the lock: declared before it)
  }
  stats_.idle_bytes += static_cast<int64_t>(b->bytes);
  idle_[b->bytes].push_back(std::move(b));
}

void PinnedBufferPool::PinLoop() {
  for (;;) {
    std::shared_ptr<Buffer> b;
    {
      absl::MutexLock lock(&mu_);
      auto work = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return stop_ || !to_pin_.empty(); };
      mu_.Await(absl::Condition(&work));
      if (stop_) return;
      b = to_pin_.front().lock();  // null: dropped before its turn
      to_pin_.pop_front();
      pinning_ = b != nullptr;
    }
    if (!b) continue;
    std::shared_ptr<void> handle = pin_(b->data, b->bytes);
    {
      absl::MutexLock lock(&b->mu);
      b->pin = std::move(handle);
    }
    b.reset();  // may be the last owner: unpinned and freed here
    absl::MutexLock lock(&mu_);
    pinning_ = false;
    ++stats_.pinned;
  }
}

void PinnedBufferPool::WaitPinned() {
  absl::MutexLock lock(&mu_);
  auto done = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return stop_ || !pin_ || (to_pin_.empty() && !pinning_);
  };
  mu_.Await(absl::Condition(&done));
}

PinnedPoolStats PinnedBufferPool::stats() const {
  absl::MutexLock lock(&mu_);
  return stats_;
}

}  // namespace ballast::transfer
