#include "memory/host_block_pool.h"

#include <cstring>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace ballast::memory {

absl::StatusOr<std::unique_ptr<HostBlockPool>> HostBlockPool::Create(size_t block_bytes,
                                                                     int64_t num_blocks) {
  if (block_bytes == 0 || num_blocks <= 0) {
    return absl::InvalidArgumentError(absl::StrCat("HostBlockPool needs block_bytes > 0 and ",
                                                   "num_blocks > 0 (got ", block_bytes, ", ",
                                                   num_blocks, ")"));
  }
  return std::unique_ptr<HostBlockPool>(new HostBlockPool(block_bytes, num_blocks, nullptr));
}

absl::StatusOr<std::unique_ptr<HostBlockPool>> HostBlockPool::CreateOver(uint8_t* storage,
                                                                         size_t block_bytes,
                                                                         int64_t num_blocks) {
  if (storage == nullptr || block_bytes == 0 || num_blocks <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("HostBlockPool needs storage, block_bytes > 0 and num_blocks > 0 (got ",
                     block_bytes, ", ", num_blocks, ")"));
  }
  return std::unique_ptr<HostBlockPool>(new HostBlockPool(block_bytes, num_blocks, storage));
}

HostBlockPool::HostBlockPool(size_t block_bytes, int64_t num_blocks, uint8_t* external)
    : block_bytes_(block_bytes),
      num_blocks_(num_blocks),
      storage_(external ? nullptr : new uint8_t[block_bytes * static_cast<size_t>(num_blocks)]),
      base_(external ? external : storage_.get()) {
  free_.reserve(static_cast<size_t>(num_blocks));
  for (int64_t i = num_blocks - 1; i >= 0; --i) free_.push_back(static_cast<BlockId>(i));
  used_.assign(static_cast<size_t>(num_blocks), false);
}

absl::StatusOr<std::vector<BlockId>> HostBlockPool::Allocate(int n) {
  absl::MutexLock lock(&mu_);
  if (n < 0 || static_cast<size_t>(n) > free_.size()) {
    return absl::ResourceExhaustedError(
        absl::StrCat("KV pool: ", n, " blocks wanted, ", free_.size(), " free"));
  }
  std::vector<BlockId> out(free_.end() - n, free_.end());
  free_.resize(free_.size() - n);
  for (BlockId b : out) used_[b] = true;
  return out;
}

absl::Status HostBlockPool::Free(absl::Span<const BlockId> blocks) {
  absl::MutexLock lock(&mu_);
  // Validate the whole span first (all or nothing). A block listed twice is
  // caught by marking each one free as it passes, then restoring the marks.
  absl::Status bad;
  size_t checked = 0;
  for (; checked < blocks.size(); ++checked) {
    const BlockId b = blocks[checked];
    if (b < 0 || b >= num_blocks_) {
      bad = absl::InvalidArgumentError(
          absl::StrCat("KV pool: free of block ", b, " outside the pool [0, ", num_blocks_, ")"));
      break;
    }
    if (!used_[b]) {
      bad = absl::FailedPreconditionError(
          absl::StrCat("KV pool: free of block ", b, ", which is not allocated (double free)"));
      break;
    }
    used_[b] = false;
  }
  if (!bad.ok()) {
    for (size_t i = 0; i < checked; ++i) used_[blocks[i]] = true;
    return bad;
  }
  free_.insert(free_.end(), blocks.begin(), blocks.end());
  return absl::OkStatus();
}

uint8_t* HostBlockPool::Address(BlockId id) {
  return base_ + static_cast<size_t>(id) * block_bytes_;
}

int64_t HostBlockPool::num_free() const {
  absl::MutexLock lock(&mu_);
  return static_cast<int64_t>(free_.size());
}

}  // namespace ballast::memory
