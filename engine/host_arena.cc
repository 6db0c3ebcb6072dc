#include "engine/host_arena.h"

#include <algorithm>

#include "absl/strings/str_cat.h"

namespace ballast::engine {

absl::StatusOr<std::shared_ptr<HostArena>> HostArena::Create(const HostArenaOptions& options,
                                                             HostSlabSource source) {
  const size_t chunk = options.chunk_bytes;
  if (chunk == 0 || options.slab_bytes < chunk || options.slab_bytes % chunk != 0) {
    return absl::InvalidArgumentError(absl::StrCat("host arena: slab_bytes ", options.slab_bytes,
                                                   " must be a multiple of chunk_bytes ", chunk));
  }
  const int64_t chunks = options.bytes / static_cast<int64_t>(chunk);
  if (chunks < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("host arena: ", options.bytes, " bytes hold no chunk of ", chunk, " bytes"));
  }
  std::shared_ptr<HostArena> a(new HostArena(chunk, std::move(source)));
  int64_t left = chunks * static_cast<int64_t>(chunk);
  std::vector<uint8_t*> free;
  while (left > 0) {
    const size_t n = static_cast<size_t>(std::min<int64_t>(left, options.slab_bytes));
    auto slab = a->source_.allocate(n);
    if (!slab.ok()) {
      return absl::Status(slab.status().code(),
                          absl::StrCat("host arena: allocating ", n, " bytes (", a->capacity_ >> 20,
                                       " MiB already held): ", slab.status().message()));
    }
    a->slabs_.push_back(*slab);  // the destructor releases it, even if a later one fails
    auto* base = static_cast<uint8_t*>(*slab);
    for (size_t off = 0; off < n; off += chunk) free.push_back(base + off);
    a->capacity_ += static_cast<int64_t>(n);
    left -= static_cast<int64_t>(n);
  }
  // Lent from the front in address order: an image's chunks are adjacent
  // while the arena is young.
  std::reverse(free.begin(), free.end());
  absl::MutexLock lock(&a->mu_);
  a->free_ = std::move(free);
  return a;
}

HostArena::~HostArena() {
  for (void* s : slabs_) source_.release(s);
}

absl::StatusOr<HostChunks> HostArena::Take(size_t bytes) {
  const size_t n = std::max<size_t>(1, (bytes + chunk_bytes_ - 1) / chunk_bytes_);
  absl::MutexLock lock(&mu_);
  if (n > free_.size()) {
    return absl::ResourceExhaustedError(
        absl::StrCat("host arena: ", bytes, " bytes need ", n, " chunks of ", chunk_bytes_,
                     " bytes; ", free_.size(), " of ", capacity_ / chunk_bytes_, " are free"));
  }
  HostChunks out;
  out.chunk_bytes = chunk_bytes_;
  out.bytes = bytes;
  out.chunks.assign(free_.rbegin(), free_.rbegin() + static_cast<std::ptrdiff_t>(n));
  free_.resize(free_.size() - n);
  return out;
}

void HostArena::Give(const HostChunks& image) {
  absl::MutexLock lock(&mu_);
  free_.insert(free_.end(), image.chunks.rbegin(), image.chunks.rend());
}

int64_t HostArena::free_bytes() const {
  absl::MutexLock lock(&mu_);
  return static_cast<int64_t>(free_.size() * chunk_bytes_);
}

}  // namespace ballast::engine
