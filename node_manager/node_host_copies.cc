// NodeManager's host copies of evicted models' weights: the pinned arena
// they are made in (once, at start) and the copy an eviction keeps.
#include "absl/strings/str_cat.h"
#include "engine/gpu_backend.h"
#include "node_manager/node_manager.h"
#include "spdlog/spdlog.h"

namespace ballast::node_manager {

// The pinned memory evicted models' host copies are made in, pinned now so
// that no eviction pins (engine/host_arena.h).
absl::StatusOr<std::shared_ptr<engine::HostArena>> NodeManager::PinHostCopyArena(int64_t bytes) {
  const absl::Time t0 = absl::Now();
  auto arena = engine::CreatePinnedHostArena(bytes);
  if (!arena.ok()) {
    return absl::Status(arena.status().code(),
                        absl::StrCat("node.memory.host_weight_cache_mib: pinning ", bytes >> 20,
                                     " MiB of host memory for weight copies failed (",
                                     arena.status().message(), "); lower it, or 0 for none"));
  }
  spdlog::info("pinned {} MiB of host memory for evicted models' weights in {:.2f} s",
               (*arena)->capacity_bytes() >> 20, absl::ToDoubleSeconds(absl::Now() - t0));
  return arena;
}

void NodeManager::KeepHostCopy(const std::string& name, engine::ModelEngine& e) {
  const std::string& path = e.options().path;
  const engine::WeightQuant quant = e.config().weight_quant;
  // Weights are immutable, so a copy made earlier is still this model's:
  // the one in the cache, or the one this engine was activated from (the
  // cache may have dropped it since).
  if (host_cache_.Contains(name, path, quant)) return;
  if (e.options().host_weights) {
    host_cache_.Put(name, path, quant, e.options().host_weights);
    return;
  }
  if (!host_cache_.Fits(e.weight_bytes())) return;
  if (host_arena_) {
    // Copies take whole chunks; engines hold the copies they were activated
    // from (and layer streaming's images), which dropping cannot free.
    const int64_t chunk = static_cast<int64_t>(host_arena_->chunk_bytes());
    const int64_t need = (e.weight_bytes() + chunk - 1) / chunk * chunk;
    if (host_arena_->free_bytes() + host_cache_.DroppableBytes() < need) {
      spdlog::warn("model {}: no host copy kept: the {} MiB it needs are held by resident models",
                   name, need >> 20);
      return;
    }
  }
  // Copying the weights out while the engine still steps is safe. A full
  // arena makes room by dropping the least recently used copies (their
  // chunks return once no engine holds them).
  absl::StatusOr<std::shared_ptr<const engine::HostWeights>> hw = e.KeepHostWeights();
  while (absl::IsResourceExhausted(hw.status()) && host_cache_.DropLeastRecent()) {
    hw = e.KeepHostWeights();
  }
  if (hw.ok()) {
    host_cache_.Put(name, path, quant, std::move(*hw));
  } else {
    spdlog::warn("model {}: keeping a host copy of the weights failed: {}", name,
                 std::string(hw.status().message()));
  }
}

}  // namespace ballast::node_manager
