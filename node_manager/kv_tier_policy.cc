#include "node_manager/kv_tier_policy.h"

#include <tuple>

namespace ballast::node_manager {

bool DramEvictable(const TierCopy& c) { return c.in_dram && !c.ssd_pending; }

bool DramEvictsBefore(const TierCopy& a, const TierCopy& b) {
  return a.priority != b.priority ? a.priority < b.priority : a.last_use < b.last_use;
}

TierEviction DramEviction(const TierCopy& c) {
  return c.on_ssd ? TierEviction::kDemote : TierEviction::kDrop;
}

bool SsdEvictable(const TierCopy& c) { return c.on_ssd; }

bool SsdEvictsBefore(const TierCopy& a, const TierCopy& b) {
  return std::make_tuple(a.named, a.priority, a.last_use) <
         std::make_tuple(b.named, b.priority, b.last_use);
}

TierEviction SsdEviction(const TierCopy& c) {
  return c.in_dram ? TierEviction::kKeepDramOnly : TierEviction::kDrop;
}

}  // namespace ballast::node_manager
