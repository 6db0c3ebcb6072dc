#include "memory/block_allocator.h"

#include <algorithm>

namespace ballast::memory {

void CountSlabBlocks(absl::Span<const BlockId> ids, int slab_shift, std::vector<SlabBlocks>* out) {
  if (ids.empty()) return;
  std::vector<int64_t> slabs;
  slabs.reserve(ids.size());
  for (BlockId id : ids) slabs.push_back(static_cast<int64_t>(id) >> slab_shift);
  std::sort(slabs.begin(), slabs.end());
  std::vector<SlabBlocks> merged;
  merged.reserve(out->size() + 8);
  size_t o = 0;
  for (size_t i = 0; i < slabs.size();) {
    size_t j = i;
    while (j < slabs.size() && slabs[j] == slabs[i]) ++j;
    while (o < out->size() && (*out)[o].slab < slabs[i]) merged.push_back((*out)[o++]);
    SlabBlocks b{slabs[i], static_cast<int64_t>(j - i)};
    if (o < out->size() && (*out)[o].slab == slabs[i]) b.blocks += (*out)[o++].blocks;
    merged.push_back(b);
    i = j;
  }
  while (o < out->size()) merged.push_back((*out)[o++]);
  *out = std::move(merged);
}

}  // namespace ballast::memory
