// KvArena's compaction: draining slabs so that their blocks move to the
// free blocks of other slabs of their size (kv_arena.h, BeginDrain).
#include <algorithm>
#include <tuple>

#include "absl/strings/str_cat.h"
#include "memory/kv_arena.h"

namespace ballast::memory {

std::vector<int64_t> KvArena::BeginDrain(int64_t slabs, const std::vector<int64_t>& exclude) {
  absl::MutexLock lock(&mu_);
  std::vector<int64_t> out;
  if (slabs <= 0 || !draining_.empty()) return out;
  // Of each size, at most formatted - ceil(used / blocks per slab) slabs
  // can empty: the rest must hold the blocks in use.
  std::vector<int64_t> room(classes_.size());
  for (size_t k = 0; k < classes_.size(); ++k) {
    const Class& c = classes_[k];
    room[k] = c.formatted - (c.used + c.blocks_per_slab - 1) / c.blocks_per_slab;
  }
  // Cheapest first: the fewest bytes to move, then the lower slab.
  std::vector<std::tuple<int64_t, int, int>> candidates;  // (bytes, slab, class)
  for (size_t i = 0; i < slabs_.size(); ++i) {
    const Slab& s = slabs_[i];
    if (s.state != Slab::State::kFormatted || s.used == 0) continue;
    if (std::binary_search(exclude.begin(), exclude.end(), static_cast<int64_t>(i))) continue;
    const auto bytes =
        static_cast<int64_t>(s.used) * static_cast<int64_t>(classes_[s.cls].block_bytes);
    candidates.emplace_back(bytes, static_cast<int>(i), s.cls);
  }
  std::sort(candidates.begin(), candidates.end());
  for (const auto& [bytes, slab, cls] : candidates) {
    if (static_cast<int64_t>(out.size()) >= slabs) break;
    if (room[cls] <= 0) continue;
    --room[cls];
    Slab& s = slabs_[slab];
    classes_[cls].partial.erase({-s.used, slab});
    s.draining = true;
    draining_.push_back(slab);
    out.push_back(slab);
  }
  std::sort(out.begin(), out.end());
  return out;
}

void KvArena::EndDrain() {
  absl::MutexLock lock(&mu_);
  for (int slab : draining_) {
    Slab& s = slabs_[slab];
    if (!s.draining) continue;  // emptied (ReleaseSlab cleared the mark)
    s.draining = false;
    if (!s.free.empty()) classes_[s.cls].partial.insert({-s.used, slab});
  }
  draining_.clear();
}

std::vector<int64_t> KvArena::draining() const {
  absl::MutexLock lock(&mu_);
  std::vector<int64_t> out;
  for (int slab : draining_) {
    if (slabs_[slab].draining) out.push_back(slab);
  }
  std::sort(out.begin(), out.end());
  return out;
}

absl::StatusOr<std::vector<BlockId>> KvArena::AllocateForMove(int cls, int tenant, int n) {
  absl::MutexLock lock(&mu_);
  Class& c = classes_[cls];
  // The partial set holds no draining slab; count its room first so that
  // nothing is taken when it lacks some.
  int64_t room = 0;
  for (const auto& [neg_used, slab] : c.partial) {
    room += c.blocks_per_slab + neg_used;
    if (room >= n) break;
  }
  if (room < n) {
    return absl::ResourceExhaustedError(
        absl::StrCat("KV arena: ", n, " blocks of ", c.block_bytes,
                     " bytes to move, but the slabs not draining have room for ", room));
  }
  std::vector<BlockId> out;
  out.reserve(static_cast<size_t>(std::max(n, 0)));
  while (static_cast<int>(out.size()) < n) {
    out.push_back(TakeBlock(c, c.partial.begin()->second, tenant));  // the fullest first
  }
  tenants_[tenant].used_bytes += static_cast<int64_t>(n) * static_cast<int64_t>(c.block_bytes);
  return out;
}

}  // namespace ballast::memory
