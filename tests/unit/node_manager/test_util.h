// Helpers shared by the node_manager tests: a sink that records the
// outcome, a request builder, a bounded wait, and the greedy output of a
// request on a private engine (the reference a shared device must match).
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "engine/model_engine.h"
#include "gtest/gtest.h"
#include "node_manager/device_worker.h"

namespace ballast::node_manager::testing {

using engine::GenerationRequest;
using engine::GenerationResult;
using engine::ModelEngine;
using engine::ModelEngineOptions;

struct Done : engine::GenerationSink {
  void OnToken(int, const std::string&, const engine::TokenLogprobs*) override {}
  void OnDone(absl::StatusOr<GenerationResult> r) override {
    absl::MutexLock lock(&mu);
    result = std::move(r);
    done = true;
  }
  bool Finished() {
    absl::MutexLock lock(&mu);
    return done;
  }
  // Waits (on a condition, not a poll) for OnDone; false after `limit`.
  bool AwaitDone(absl::Duration limit) {
    absl::MutexLock lock(&mu);
    return mu.AwaitWithTimeout(absl::Condition(&done), limit);
  }
  absl::Mutex mu;
  bool done = false;
  absl::StatusOr<GenerationResult> result = absl::UnknownError("not done");
};

inline GenerationRequest Req(const std::string& id, int salt, int prompt, int out) {
  GenerationRequest r;
  r.id = id;
  r.prompt = {engine::ByteTokenizer::kBos};
  for (int i = 1; i < prompt; ++i) r.prompt.push_back((i * 37 + salt * 11) % 256);
  r.params.max_tokens = out;
  r.params.ignore_eos = true;
  return r;
}

// Greedy output of `r` on a private, roomy engine.
inline std::vector<int> Alone(const std::string& path, const GenerationRequest& r) {
  ModelEngineOptions o;
  o.name = "alone";
  o.path = path;
  o.kv_cache_bytes = 64 << 20;
  auto e = std::move(*ModelEngine::Create(o));
  Done d;
  EXPECT_TRUE(e->Submit(r, &d).ok());
  while (e->HasWork()) e->Step();
  return d.result.ok() ? d.result->output_tokens : std::vector<int>{};
}

inline bool WaitFor(const std::function<bool()>& cond, absl::Duration limit) {
  const absl::Time end = absl::Now() + limit;
  while (absl::Now() < end) {
    if (cond()) return true;
    absl::SleepFor(absl::Milliseconds(1));
  }
  return cond();
}

// Host pages of `page` bytes, slabs of one page: small tiny-model devices.
inline DeviceMemoryOptions HostPages(size_t page = 64 << 10) {
  DeviceMemoryOptions mem;
  mem.page_bytes = page;
  mem.slab_bytes = page;
  mem.gpu = -1;
  return mem;
}

// Activation as the node does it: weight pages from the balloon (the
// device reclaims KV for them), then the engine over those pages, then
// added to the device.
// prepare_remap: T_T and T_c measured at activation (ModelEngineOptions).
inline absl::StatusOr<std::shared_ptr<ModelEngine>> Activate(const std::string& name,
                                                             const std::string& path,
                                                             DeviceWorker* w,
                                                             bool prepare_remap = false) {
  ModelEngineOptions o;
  o.name = name;
  o.path = path;
  o.prepare_remap = prepare_remap;
  o.kv_arena = w->arena();
  auto need = ModelEngine::WeightBytesNeeded(o);
  if (!need.ok()) return need.status();
  auto pages = w->ReserveWeights(*need);
  if (!pages.ok()) return pages.status();
  o.weight_pages = std::move(*pages);
  o.reclaim_kv = w->ReclaimKvFor(name);
  auto e = ModelEngine::Create(o, [w] { w->Wake(); });
  if (!e.ok()) return e.status();
  std::shared_ptr<ModelEngine> engine = std::move(*e);
  if (auto st = w->Add(engine); !st.ok()) return st;
  return engine;
}

}  // namespace ballast::node_manager::testing
