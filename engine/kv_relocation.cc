#include "engine/kv_relocation.h"

#include <algorithm>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"

namespace ballast::engine {
namespace {

// Where one block to move is listed.
struct Ref {
  SequenceKv* table;
  size_t layer, index;
};

// The table entries whose blocks lie in `slabs`, in table order.
absl::StatusOr<std::vector<Ref>> FindBlocks(absl::Span<SequenceKv* const> tables,
                                            absl::Span<const int64_t> slabs, int slab_shift) {
  std::vector<Ref> refs;
  absl::flat_hash_set<memory::BlockId> seen;
  for (SequenceKv* t : tables) {
    for (size_t l = 0; l < t->blocks.size(); ++l) {
      const std::vector<memory::BlockId>& ids = t->blocks[l];
      for (size_t i = 0; i < ids.size(); ++i) {
        const int64_t slab = static_cast<int64_t>(ids[i]) >> slab_shift;
        if (!std::binary_search(slabs.begin(), slabs.end(), slab)) continue;
        if (!seen.insert(ids[i]).second) {
          return absl::FailedPreconditionError(
              absl::StrCat("KV relocation: block ", ids[i], " is listed twice"));
        }
        refs.push_back({t, l, i});
      }
    }
  }
  return refs;
}

}  // namespace

absl::StatusOr<int64_t> RelocateBlocks(absl::Span<SequenceKv* const> tables,
                                       absl::Span<const int64_t> slabs,
                                       memory::BlockAllocator* allocator, const KvMoveFn& copy) {
  const memory::BlockAddressing addr = allocator->addressing();
  if (slabs.empty() || addr.slab_bytes == 0) return 0;
  auto refs = FindBlocks(tables, slabs, addr.slab_shift);
  if (!refs.ok()) return refs.status();
  if (refs->empty()) return 0;
  auto fresh = allocator->AllocateForMove(static_cast<int>(refs->size()));
  if (!fresh.ok()) return fresh.status();
  std::vector<KvBlockMove> moves;
  std::vector<memory::BlockId> old;
  moves.reserve(refs->size());
  old.reserve(refs->size());
  for (size_t k = 0; k < refs->size(); ++k) {
    const Ref& r = (*refs)[k];
    const memory::BlockId from = r.table->blocks[r.layer][r.index];
    old.push_back(from);
    moves.push_back({allocator->Address(from), allocator->Address((*fresh)[k]), addr.block_bytes});
  }
  if (absl::Status st = copy(moves); !st.ok()) {
    (void)allocator->Free(*fresh);  // ours: cannot be refused
    return st;
  }
  for (size_t k = 0; k < refs->size(); ++k) {
    const Ref& r = (*refs)[k];
    r.table->blocks[r.layer][r.index] = (*fresh)[k];
  }
  if (absl::Status st = allocator->Free(old); !st.ok()) {
    // The tables listed a block this allocator does not hold (a caller
    // bug): put them back and give the copies up.
    for (size_t k = 0; k < refs->size(); ++k) {
      const Ref& r = (*refs)[k];
      r.table->blocks[r.layer][r.index] = old[k];
    }
    (void)allocator->Free(*fresh);
    return absl::FailedPreconditionError(absl::StrCat("KV relocation: ", st.message()));
  }
  return static_cast<int64_t>(old.size() * addr.block_bytes);
}

}  // namespace ballast::engine
