#include "transfer/pinned_pool.h"

#include <algorithm>
#include <cstdlib>
#include <new>
#include <utility>

namespace ballast::transfer {
namespace {
constexpr size_t kPage = 4096;

void FreeBuffer(uint8_t* data, std::shared_ptr<void> pin) {
  pin.reset();  // unpin first (the last owner of the handle)
  std::free(data);
}
}  // namespace

std::shared_ptr<PinnedBufferPool> PinnedBufferPool::Create(PinFn pin, size_t max_idle_bytes) {
  return std::shared_ptr<PinnedBufferPool>(new PinnedBufferPool(std::move(pin), max_idle_bytes));
}

PinnedBufferPool::PinnedBufferPool(PinFn pin, size_t max_idle_bytes)
    : pin_(std::move(pin)), max_idle_bytes_(max_idle_bytes) {}

PinnedBufferPool::~PinnedBufferPool() {
  absl::MutexLock lock(&mu_);
  for (auto& [bytes, buffers] : idle_) {
    for (Buffer& b : buffers) FreeBuffer(b.data, std::move(b.pin));
  }
}

std::unique_ptr<KvChunk> PinnedBufferPool::NewChunk(const KvChunkMeta& meta) {
  const size_t bytes = (std::max<size_t>(meta.payload_bytes(), 1) + kPage - 1) / kPage * kPage;
  Buffer b;
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
  if (b.data == nullptr) {
    b.data = static_cast<uint8_t*>(std::aligned_alloc(kPage, bytes));
    if (b.data == nullptr) throw std::bad_alloc();
    b.bytes = bytes;
    if (pin_) b.pin = pin_(b.data, bytes);
  }
  auto c = std::make_unique<KvChunk>();
  c->meta = meta;
  std::weak_ptr<PinnedBufferPool> pool = weak_from_this();
  PayloadFree release;
  // The pin handle moves with the buffer (only one owner), so "unpin,
  // then free" really unpins first.
  release.recycle = [pool, bytes = b.bytes, pin = std::move(b.pin)](uint8_t* data) mutable {
    if (auto p = pool.lock()) {
      p->Return({data, bytes, std::move(pin)});
    } else {
      FreeBuffer(data, std::move(pin));
    }
  };
  c->payload = std::unique_ptr<uint8_t[], PayloadFree>(b.data, std::move(release));
  return c;
}

void PinnedBufferPool::Return(Buffer b) {
  {
    absl::MutexLock lock(&mu_);
    if (stats_.idle_bytes + static_cast<int64_t>(b.bytes) <=
        static_cast<int64_t>(max_idle_bytes_)) {
      stats_.idle_bytes += static_cast<int64_t>(b.bytes);
      idle_[b.bytes].push_back(std::move(b));
      return;
    }
  }
  FreeBuffer(b.data, std::move(b.pin));
}

PinnedPoolStats PinnedBufferPool::stats() const {
  absl::MutexLock lock(&mu_);
  return stats_;
}

}  // namespace ballast::transfer
