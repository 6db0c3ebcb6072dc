#include "server/config_memory.h"

#include "absl/time/time.h"
#include "server/yaml_section.h"

namespace ballast::server {
namespace {

// node.memory.remap: {enabled, max_fraction, respect_timing, revert_after_ms}.
absl::Status ParseRemap(const YAML::Node& node, const std::string* file,
                        node_manager::RemapOptions* o) {
  YamlSection rs(node, "node.memory.remap", file);
  RETURN_IF_ERROR(rs.Check());
  double revert_ms = absl::ToDoubleMilliseconds(o->revert_after);
  double transfer_ms = absl::ToDoubleMilliseconds(o->layer_transfer);
  RETURN_IF_ERROR(rs.Get("enabled", &o->enabled));
  RETURN_IF_ERROR(rs.Get("max_fraction", &o->max_fraction));
  RETURN_IF_ERROR(rs.Get("respect_timing", &o->respect_timing));
  RETURN_IF_ERROR(rs.Get("revert_after_ms", &revert_ms));
  RETURN_IF_ERROR(rs.Get("layer_transfer_ms", &transfer_ms));
  RETURN_IF_ERROR(rs.Finish());
  if (!(transfer_ms >= 0)) {
    return rs.Error("node.memory.remap.layer_transfer_ms", "must be >= 0 (0: measured)");
  }
  o->layer_transfer = absl::Milliseconds(transfer_ms);
  if (!(o->max_fraction > 0 && o->max_fraction < 1)) {
    return rs.Error("node.memory.remap.max_fraction", "must be in (0, 1)");
  }
  if (!(revert_ms >= 0)) return rs.Error("node.memory.remap.revert_after_ms", "must be >= 0");
  o->revert_after = absl::Milliseconds(revert_ms);
  return absl::OkStatus();
}

}  // namespace

// node.memory: mode, slab size, host weight cache and remapping.
absl::Status ParseNodeMemory(const YAML::Node& m, const std::string* file,
                             node_manager::NodeOptions* o) {
  YamlSection ms(m, "node.memory", file);
  RETURN_IF_ERROR(ms.Check());
  int64_t slab_mib = static_cast<int64_t>(o->slab_bytes >> 20);
  int64_t host_mib = o->host_weight_cache_bytes >> 20;
  RETURN_IF_ERROR(ms.Get("mode", &o->memory_mode));
  RETURN_IF_ERROR(ms.Get("slab_mib", &slab_mib));
  RETURN_IF_ERROR(ms.Get("host_weight_cache_mib", &host_mib));
  if (YAML::Node r = ms.Child("remap")) RETURN_IF_ERROR(ParseRemap(r, file, &o->remap));
  RETURN_IF_ERROR(ms.Finish());
  if (host_mib < 0) return ms.Error("node.memory.host_weight_cache_mib", "must be >= 0");
  o->host_weight_cache_bytes = host_mib << 20;
  if (o->memory_mode != "elastic" && o->memory_mode != "static") {
    return ms.Error("node.memory.mode", "expected elastic or static");
  }
  if (slab_mib <= 0 || slab_mib % 2 != 0)
    return ms.Error("node.memory.slab_mib", "must be a positive multiple of 2");
  o->slab_bytes = static_cast<size_t>(slab_mib) << 20;
  return absl::OkStatus();
}

}  // namespace ballast::server
