// HostBlockPool: a BlockAllocator over one host allocation of
// `num_blocks * block_bytes` bytes with a LIFO free list (recently freed
// blocks are reused first, which keeps them warm in cache). Free refuses a
// double or out-of-range free with a status and frees nothing of that call.
//
// Thread-safety: all methods are thread-safe (one mutex).
#pragma once

#include <memory>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "memory/block_allocator.h"

namespace ballast::memory {

class HostBlockPool final : public BlockAllocator {
 public:
  // block_bytes > 0 and num_blocks > 0, else INVALID_ARGUMENT.
  static absl::StatusOr<std::unique_ptr<HostBlockPool>> Create(size_t block_bytes,
                                                               int64_t num_blocks);
  // A pool over caller-owned memory of num_blocks * block_bytes bytes (for
  // example device memory: the pool never touches the bytes). `storage`
  // must outlive the pool.
  static absl::StatusOr<std::unique_ptr<HostBlockPool>> CreateOver(uint8_t* storage,
                                                                   size_t block_bytes,
                                                                   int64_t num_blocks);

  absl::StatusOr<std::vector<BlockId>> Allocate(int n) override;
  // Checked in every build (BlockAllocator::Free): nothing is freed unless
  // every block of the span is allocated and listed once.
  absl::Status Free(absl::Span<const BlockId> blocks) override;
  uint8_t* Address(BlockId id) override;
  size_t block_bytes() const override { return block_bytes_; }
  BlockAddressing addressing() const override { return {base_, 31, 0, block_bytes_}; }
  int64_t num_total() const override { return num_blocks_; }
  int64_t num_free() const override;

 private:
  HostBlockPool(size_t block_bytes, int64_t num_blocks, uint8_t* external);

  const size_t block_bytes_;
  const int64_t num_blocks_;
  std::unique_ptr<uint8_t[]> storage_;  // null when the memory is the caller's
  uint8_t* const base_;
  mutable absl::Mutex mu_;
  std::vector<BlockId> free_ ABSL_GUARDED_BY(mu_);
  std::vector<bool> used_ ABSL_GUARDED_BY(mu_);
};

}  // namespace ballast::memory
