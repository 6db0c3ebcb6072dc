#include "sim/sim_kv_tiers.h"

namespace ballast::sim {

using node_manager::TierEviction;

SimKvTiers::Held SimKvTiers::Find(int session, int model) const {
  auto it = copies_.find(session);
  if (it == copies_.end() || it->second.model != model) return {};
  const Copy& c = it->second;
  return {c.tokens, c.bytes, c.c.in_dram, c.c.on_ssd};
}

void SimKvTiers::Put(int session, int model, int tokens, int64_t bytes, int priority) {
  if (!enabled() || tokens <= 0) return;
  if (auto it = copies_.find(session); it != copies_.end()) Erase(it);
  Copy& c = copies_[session];
  c.model = model;
  c.tokens = tokens;
  c.bytes = bytes;
  c.c.in_dram = true;
  c.c.ssd_pending = ssd_budget_ > 0;
  c.c.priority = priority;
  c.c.last_use = ++clock_;
  dram_used_ += bytes;
  TrimDram();
  if (ssd_budget_ <= 0) return;
  // The write ends (at once): the copy is on SSD, then both tiers trim.
  auto it = copies_.find(session);
  if (it == copies_.end()) return;
  it->second.c.ssd_pending = false;
  it->second.c.on_ssd = true;
  ssd_used_ += bytes;
  TrimSsd();
  TrimDram();
}

SimKvTiers::Held SimKvTiers::Read(int session, int model) {
  auto it = copies_.find(session);
  if (it == copies_.end() || it->second.model != model) return {};
  Copy& c = it->second;
  c.c.last_use = ++clock_;
  const Held found{c.tokens, c.bytes, c.c.in_dram, c.c.on_ssd};
  if (!c.c.in_dram) {  // read from SSD: promoted into DRAM
    c.c.in_dram = true;
    dram_used_ += c.bytes;
    TrimDram();
  }
  return found;
}

void SimKvTiers::Erase(Map::iterator it) {
  const Copy& c = it->second;
  if (c.c.in_dram) dram_used_ -= c.bytes;
  if (c.c.on_ssd) ssd_used_ -= c.bytes;
  copies_.erase(it);
}

void SimKvTiers::TrimDram() {
  auto view = [](const Map::value_type& kv) { return kv.second.c; };
  while (dram_used_ > dram_budget_) {
    auto victim = node_manager::PickDramVictim(copies_.begin(), copies_.end(), view);
    if (victim == copies_.end()) return;
    if (node_manager::DramEviction(victim->second.c) == TierEviction::kDemote) {
      victim->second.c.in_dram = false;
      dram_used_ -= victim->second.bytes;
      ++counters_.demoted;
    } else {
      ++counters_.dropped;
      Erase(victim);
    }
  }
}

void SimKvTiers::TrimSsd() {
  auto view = [](const Map::value_type& kv) { return kv.second.c; };
  while (ssd_used_ > ssd_budget_) {
    auto victim = node_manager::PickSsdVictim(copies_.begin(), copies_.end(), view);
    if (victim == copies_.end()) return;
    ++counters_.ssd_evicted;
    if (node_manager::SsdEviction(victim->second.c) == TierEviction::kKeepDramOnly) {
      victim->second.c.on_ssd = false;
      ssd_used_ -= victim->second.bytes;
    } else {
      ++counters_.dropped;
      Erase(victim);
    }
  }
}

}  // namespace ballast::sim
