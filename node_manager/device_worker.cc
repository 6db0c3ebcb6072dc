#include "node_manager/device_worker.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "spdlog/spdlog.h"
#include "engine/gpu_backend.h"
#include "memory/page_pool.h"

namespace ballast::node_manager {

absl::StatusOr<std::unique_ptr<DeviceWorker>> DeviceWorker::Create(
    std::string name, int64_t memory_bytes, const DeviceMemoryOptions& memory) {
  std::unique_ptr<DeviceWorker> w(new DeviceWorker(std::move(name), memory_bytes));
  w->gpu_ = memory.gpu;
  if (memory.elastic) {
    absl::StatusOr<std::shared_ptr<memory::PagePool>> pool =
        memory.gpu >= 0 ? engine::CreateGpuPagePool(memory.gpu, memory.page_bytes, memory_bytes)
                        : absl::StatusOr<std::shared_ptr<memory::PagePool>>(
                              memory::HostPagePool::Create(memory.page_bytes, memory_bytes));
    if (!pool.ok()) return pool.status();
    memory::KvArenaOptions o;
    o.slab_bytes = memory.slab_bytes;
    // Reserve address space for the whole device, rounded up to slabs.
    o.reserve_bytes = ((static_cast<size_t>(memory_bytes) + memory.slab_bytes - 1) / memory.slab_bytes) *
                      memory.slab_bytes;
    auto arena = memory::KvArena::Create(std::move(*pool), o);
    if (!arena.ok()) return arena.status();
    w->arena_ = std::move(*arena);
  }
  w->thread_ = std::thread([raw = w.get()] { raw->Loop(); });
  return w;
}

DeviceWorker::DeviceWorker(std::string name, int64_t memory_bytes)
    : name_(std::move(name)), memory_bytes_(memory_bytes) {}

void DeviceWorker::UpdateKvBudget() {
  if (!arena_) return;
  int64_t weights = 0;
  for (const auto& [n, e] : engines_) weights += e->weight_bytes();
  arena_->pool()->SetBudget(std::max<int64_t>(0, memory_bytes_ - weights));
}

DeviceWorker::~DeviceWorker() { Stop(); }

void DeviceWorker::Stop() {
  {
    absl::MutexLock lock(&mu_);
    if (stop_) return;
    stop_ = true;
    cv_.Signal();
  }
  if (thread_.joinable()) thread_.join();  // not started if Create failed
  std::vector<std::function<void(bool)>> tasks;
  {
    absl::MutexLock lock(&mu_);
    tasks.swap(tasks_);
  }
  for (auto& t : tasks) t(false);
  std::map<std::string, std::shared_ptr<engine::ModelEngine>> engines;
  std::vector<std::shared_ptr<engine::ModelEngine>> retiring;
  {
    absl::MutexLock lock(&mu_);
    engines.swap(engines_);
    retiring.swap(retiring_);
  }
  for (auto& [n, e] : engines) e->AbortAll(absl::UnavailableError("node shutting down"));
  for (auto& e : retiring) e->AbortAll(absl::UnavailableError("node shutting down"));
}

void DeviceWorker::Wake() {
  absl::MutexLock lock(&mu_);
  wake_ = true;
  cv_.Signal();
}

absl::Status DeviceWorker::Add(std::shared_ptr<engine::ModelEngine> engine) {
  absl::MutexLock lock(&mu_);
  if (engines_.count(engine->name())) {
    return absl::AlreadyExistsError(absl::StrCat("model ", engine->name(), " already on ", name_));
  }
  engines_[engine->name()] = std::move(engine);
  UpdateKvBudget();
  wake_ = true;
  cv_.Signal();
  return absl::OkStatus();
}

bool DeviceWorker::Remove(const std::string& model) {
  absl::MutexLock lock(&mu_);
  auto it = engines_.find(model);
  if (it == engines_.end()) return false;
  retiring_.push_back(std::move(it->second));
  engines_.erase(it);
  UpdateKvBudget();
  wake_ = true;
  cv_.Signal();
  return true;
}

absl::Status DeviceWorker::AddReclaiming(std::shared_ptr<engine::ModelEngine> engine,
                                         int64_t need_bytes) {
  absl::Status result;
  absl::Notification done;
  {
    absl::MutexLock lock(&mu_);
    if (stop_) return absl::UnavailableError(absl::StrCat("device ", name_, " is stopping"));
    tasks_.push_back([&, engine = std::move(engine)](bool run) mutable {
      result = run ? ReclaimAndAdd(std::move(engine), need_bytes)
                   : absl::UnavailableError(absl::StrCat("device ", name_, " stopped"));
      done.Notify();
    });
    wake_ = true;
    cv_.Signal();
  }
  done.WaitForNotification();
  return result;
}

int64_t DeviceWorker::FreeBytes() const {
  const DeviceUsage u = Usage();
  return u.memory_total_bytes - u.memory_used_bytes;
}

absl::Status DeviceWorker::ReclaimAndAdd(std::shared_ptr<engine::ModelEngine> engine,
                                         int64_t need_bytes) {
  int64_t free = FreeBytes();
  if (free < need_bytes && arena_) {
    arena_->ReclaimFreeSlabs();
    free = FreeBytes();
  }
  int64_t shed = 0;
  if (arena_) {
    for (const auto& e : Engines()) {
      // Each call frees whole sequences; slabs empty only once all their
      // blocks are gone, so keep shedding until the room is there.
      while (free < need_bytes) {
        const int64_t got = e->ShedKv(need_bytes - free);
        if (got == 0) break;
        shed += got;
        arena_->ReclaimFreeSlabs();
        free = FreeBytes();
      }
      if (free >= need_bytes) break;
    }
  }
  if (free < need_bytes) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "model ", engine->name(), " needs ", need_bytes, " bytes of weights but device ", name_,
        " has ", free, " free even after the other models gave back ", shed, " bytes of KV"));
  }
  if (shed > 0) {
    spdlog::info("device {}: other models shed {} bytes of KV for {}", name_, shed, engine->name());
  }
  return Add(std::move(engine));
}

std::shared_ptr<engine::ModelEngine> DeviceWorker::Find(const std::string& model) const {
  absl::MutexLock lock(&mu_);
  auto it = engines_.find(model);
  return it == engines_.end() ? nullptr : it->second;
}

std::vector<std::shared_ptr<engine::ModelEngine>> DeviceWorker::Engines() const {
  absl::MutexLock lock(&mu_);
  std::vector<std::shared_ptr<engine::ModelEngine>> out;
  for (const auto& [n, e] : engines_) out.push_back(e);
  return out;
}

DeviceUsage DeviceWorker::Usage() const {
  DeviceUsage u;
  u.memory_total_bytes = memory_bytes_;
  for (const auto& e : Engines()) {
    const engine::EngineStats s = e->stats();
    u.memory_used_bytes += e->weight_bytes() + (arena_ ? 0 : e->options().kv_cache_bytes);
    if (!arena_) {
      u.kv_blocks_total += s.kv_blocks_total;
      u.kv_blocks_free += s.kv_blocks_free;
      u.kv_bytes_used += e->kv_bytes() - s.kv_blocks_free * static_cast<int64_t>(e->kv_block_bytes());
      u.kv_bytes_free += s.kv_blocks_free * static_cast<int64_t>(e->kv_block_bytes());
    }
    u.waiting += s.waiting;
    u.running += s.running;
    u.preemptions += s.preemptions;
    u.models.push_back(e->name());
  }
  if (arena_) {
    const memory::PagePoolStats ps = arena_->pool()->stats();
    const memory::KvArenaStats as = arena_->stats();
    u.memory_used_bytes += ps.mapped_bytes;
    u.page_map_calls = ps.map_calls;
    u.page_unmap_calls = ps.unmap_calls;
    u.slabs_formatted = as.slabs_formatted;
    u.slabs_empty = as.slabs_empty;
    u.kv_blocks_total = as.blocks_used + as.blocks_free_formatted;
    u.kv_blocks_free = as.blocks_free_formatted;
    u.kv_bytes_used = as.bytes_used;
    u.kv_bytes_free = as.bytes_free;
  }
  return u;
}

void DeviceWorker::Loop() {
  while (true) {
    std::vector<std::shared_ptr<engine::ModelEngine>> engines, retiring;
    std::vector<std::function<void(bool)>> tasks;
    {
      absl::MutexLock lock(&mu_);
      if (stop_) return;
      tasks.swap(tasks_);
    }
    for (auto& t : tasks) t(true);  // between steps: engines are quiescent
    {
      absl::MutexLock lock(&mu_);
      if (stop_) return;
      for (const auto& [n, e] : engines_) engines.push_back(e);
      retiring.swap(retiring_);
    }
    for (auto& e : retiring) {
      e->AbortAll(absl::UnavailableError(absl::StrCat("model ", e->name(), " was evicted")));
    }
    retiring.clear();
    bool did = false;
    for (auto& e : engines) {
      if (e->HasWork()) did |= e->Step();
    }
    if (!did) {
      if (arena_) arena_->Replenish();  // idle: get the next slabs ready
      absl::MutexLock lock(&mu_);
      if (!wake_ && !stop_) cv_.WaitWithTimeout(&mu_, absl::Milliseconds(50));
      wake_ = false;
    }
  }
}

}  // namespace ballast::node_manager
