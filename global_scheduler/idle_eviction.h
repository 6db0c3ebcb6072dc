// Idle eviction (Prism §6.1): when a model must be activated and no node
// has room for its weights, the scheduler evicts a replica of a model that
// has been idle (no request) for at least the threshold (default 45 s).
//
// Rule: among the READY replicas on live nodes, of models other than the
// one being activated and not already being evicted, whose idle time is at
// least `threshold`: the longest idle first; ties go to the larger weights
// (frees more), then the lower node id, then the model name. One victim
// per call: the control loop evicts, sees the room next tick, and loads.
//
// Pure functions; thread-safe.
#pragma once

#include <functional>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "absl/time/time.h"
#include "global_scheduler/cluster_state.h"

namespace ballast::global_scheduler {

struct IdleVictim {
  std::string model;
  std::string node_id;
};

// `idle(model)`: how long since the model's last request; `skip`: models
// not to evict (the one activating, ones already leaving).
std::optional<IdleVictim> ChooseIdleVictim(
    const std::vector<NodeInfo>& nodes,
    const std::function<absl::Duration(const std::string&)>& idle, absl::Duration threshold,
    const std::set<std::string>& skip);

// KV pressure: on an elastic device (v1::DeviceState::elastic) where
// requests queue (queue_length > 0) while its KV room is below
// `free_fraction` of its memory, the resident weights leave the active
// models too little KV. The room: kv_bytes_free (free blocks, empty slabs
// and unmapped budget) plus kv_bytes_lendable (weight layers the models
// could still lend by parameter remapping: a short model gets them within
// a step, where an eviction and the reload it brings cost seconds).
// Returns the idle victim (as ChooseIdleVictim, among the READY replicas on
// that device, never one in `skip`) of the device with the least room that
// has one. Skipped: static devices (a model's fixed KV pool gains nothing
// from an eviction), devices with a load under way (its pages and the KV it
// reclaims are not pressure), and devices in `held` ("node/device" keys:
// an eviction there has not yet shown in a heartbeat).
std::optional<IdleVictim> ChooseKvPressureVictim(
    const std::vector<NodeInfo>& nodes,
    const std::function<absl::Duration(const std::string&)>& idle, absl::Duration threshold,
    const std::set<std::string>& skip, double free_fraction, const std::set<std::string>& held);

// The key of a node's device in ChooseKvPressureVictim's `held`.
std::string DeviceKey(const std::string& node_id, const std::string& device);

// Whether `node` has room for `weight_bytes` more weights on one of its
// devices: that device's memory less the weights of what it holds stays
// positive (KV is elastic and shrinks; weights do not). A model's weights
// live on one device, so room spread over several devices is no room.
// Unknown sizes (0) count as fitting.
bool HasWeightRoom(const NodeInfo& node, int64_t weight_bytes);

}  // namespace ballast::global_scheduler
