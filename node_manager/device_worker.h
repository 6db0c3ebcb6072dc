// DeviceWorker: one device's engine pool and its step thread. It holds the
// ModelEngines resident on the device and steps every engine that has work,
// round robin, one step each per pass; it sleeps when none has work and is
// woken by Submit/Cancel through the engines' wake callback.
//
// Removing a model hands its engine to the step thread, which fails the
// engine's outstanding requests (UNAVAILABLE) before dropping it, so no
// request waits forever and no engine is touched by two threads.
//
// Thread-safety: all public methods are thread-safe. Shutdown: Stop()
// (also run by the destructor) aborts all requests and joins the thread.
#pragma once

#include <functional>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "engine/model_engine.h"
#include "memory/kv_arena.h"

namespace ballast::node_manager {

struct DeviceUsage {
  int64_t memory_total_bytes = 0;
  int64_t memory_used_bytes = 0;  // weights + KV pools of resident models
  // Static mode: the models' private pools. Elastic mode: blocks in use and
  // free blocks inside formatted slabs (unformatted room is in kv_bytes_free;
  // block counts of different sizes are not comparable).
  int64_t kv_blocks_total = 0;
  int64_t kv_blocks_free = 0;
  int64_t kv_bytes_used = 0, kv_bytes_free = 0;
  int waiting = 0;
  int running = 0;
  int64_t preemptions = 0;
  std::vector<std::string> models;
  // Elastic mode: KV arena state and page-pool driver calls (cumulative).
  int64_t slabs_formatted = 0, slabs_empty = 0;
  int64_t page_map_calls = 0, page_unmap_calls = 0;
};

// How a device holds KV: one shared elastic arena, or a static pool per model.
struct DeviceMemoryOptions {
  bool elastic = true;
  size_t page_bytes = 2u << 20;  // physical page (the CUDA VMM granularity)
  size_t slab_bytes = 2u << 20;  // KV slab, a multiple of page_bytes
  // CUDA ordinal whose memory backs the arena (CUDA VMM pages); -1: host
  // pages (the cpu backend).
  int gpu = -1;
};

class DeviceWorker {
 public:
  // Fails only if the elastic arena cannot be reserved.
  static absl::StatusOr<std::unique_ptr<DeviceWorker>> Create(std::string name,
                                                              int64_t memory_bytes,
                                                              const DeviceMemoryOptions& memory);
  ~DeviceWorker();

  const std::string& name() const { return name_; }
  int64_t memory_bytes() const { return memory_bytes_; }
  // CUDA ordinal, or -1 for a host (cpu backend) device.
  int gpu() const { return gpu_; }
  // The shared KV arena (elastic mode), else null.
  const std::shared_ptr<memory::KvArena>& arena() const { return arena_; }
  // Gives empty KV slabs back so weights can use their memory.
  int64_t ReclaimKv() { return arena_ ? arena_->ReclaimFreeSlabs() : 0; }
  // Called by engines when work arrives; wakes the step thread.
  void Wake();

  // Adds a loaded engine. ALREADY_EXISTS if the name is taken.
  absl::Status Add(std::shared_ptr<engine::ModelEngine> engine);
  // Activation in elastic mode: makes `need_bytes` of device memory free for
  // the engine's weights, then adds it, atomically with respect to steps
  // (it runs on the step thread). Empty KV slabs go first; then the other
  // models shed KV (ModelEngine::ShedKv: preempted sequences recompute
  // later). RESOURCE_EXHAUSTED, with the engine not added, if even that is
  // not enough.
  absl::Status AddReclaiming(std::shared_ptr<engine::ModelEngine> engine, int64_t need_bytes);
  // Removes an engine; false if absent.
  bool Remove(const std::string& model);
  std::shared_ptr<engine::ModelEngine> Find(const std::string& model) const;
  std::vector<std::shared_ptr<engine::ModelEngine>> Engines() const;
  DeviceUsage Usage() const;
  void Stop();

 private:
  DeviceWorker(std::string name, int64_t memory_bytes);
  void Loop();
  absl::Status ReclaimAndAdd(std::shared_ptr<engine::ModelEngine> engine, int64_t need_bytes);
  int64_t FreeBytes() const;
  // REQUIRES: mu_ held. KV may use what the resident weights leave.
  void UpdateKvBudget() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const std::string name_;
  const int64_t memory_bytes_;
  int gpu_ = -1;
  std::shared_ptr<memory::KvArena> arena_;
  mutable absl::Mutex mu_;
  absl::CondVar cv_;
  bool wake_ ABSL_GUARDED_BY(mu_) = false;
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  std::map<std::string, std::shared_ptr<engine::ModelEngine>> engines_ ABSL_GUARDED_BY(mu_);
  std::vector<std::shared_ptr<engine::ModelEngine>> retiring_ ABSL_GUARDED_BY(mu_);
  // Work for the step thread; called with false if the worker stops first.
  std::vector<std::function<void(bool run)>> tasks_ ABSL_GUARDED_BY(mu_);
  std::thread thread_;
};

}  // namespace ballast::node_manager
