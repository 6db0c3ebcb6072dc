#include "node_manager/device_worker.h"

#include <algorithm>
#include <limits>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "engine/gpu_backend.h"
#include "memory/gpu_page_pool.h"
#include "memory/memory_ladder.h"
#include "memory/page_pool.h"
#include "spdlog/spdlog.h"
#include "transfer/latch.h"
#include "transfer/thread_name.h"

namespace ballast::node_manager {

absl::StatusOr<std::unique_ptr<DeviceWorker>> DeviceWorker::Create(
    std::string name, int64_t memory_bytes, const DeviceMemoryOptions& memory,
    const DeviceArbitrationOptions& arbitration) {
  if (memory.gpu >= 0) {
    auto budget = BudgetOnGpu(name, memory_bytes, memory);
    if (!budget.ok()) return budget.status();
    memory_bytes = *budget;
  }
  std::unique_ptr<DeviceWorker> w(new DeviceWorker(std::move(name), memory_bytes));
  w->gpu_ = memory.gpu;
  w->arbitration_ = arbitration;
  if (memory.elastic) {
    absl::StatusOr<std::shared_ptr<memory::PagePool>> pool =
        memory.gpu >= 0 ? memory::CreateGpuPagePool(memory.gpu, memory.page_bytes, memory_bytes)
                        : absl::StatusOr<std::shared_ptr<memory::PagePool>>(
                              memory::HostPagePool::Create(memory.page_bytes, memory_bytes));
    if (!pool.ok()) return pool.status();
    memory::BalloonOptions o;
    o.memory_bytes = memory_bytes;
    o.slab_bytes = memory.slab_bytes;
    auto balloon = memory::Balloon::Create(std::move(*pool), o);
    if (!balloon.ok()) return balloon.status();
    w->balloon_ = std::move(*balloon);
    w->slab_bytes_ = memory.slab_bytes;
    if (memory.remap.enabled) w->remap_ = std::make_unique<RemapController>(memory.remap);
  }
  if (arbitration.overlap_steps && arbitration.finish_threads > 0) {
    w->finishers_ =
        std::make_unique<transfer::WorkerPool>(arbitration.finish_threads, 0, "step-finish");
  }
  w->thread_ = std::thread([raw = w.get()] {
    transfer::NameThisThread("step-" + raw->name_);
    if (raw->arbitration_.overlap_steps && raw->arbitration_.rolling_steps) {
      raw->RollingLoop();
    } else {
      raw->Loop();
    }
  });
  return w;
}

// A budget past what the GPU has free would let the balloon and the
// scheduler plan with memory that is not there: on an 80 GB H100 the
// offline benchmark's 120,000 MiB showed 107 GB of KV free beside 16 GB of
// weights (docs/benchmarks.md, session 60). So a GPU's budget is at most
// its free memory when the node starts, in whole slabs. Where the device
// cannot be asked (no CUDA in this build), the budget stays and the engine
// reports what is wrong. Less than one slab free is an error.
absl::StatusOr<int64_t> DeviceWorker::BudgetOnGpu(const std::string& name, int64_t memory_bytes,
                                                  const DeviceMemoryOptions& memory) {
  auto info = engine::GpuMemoryInfo(memory.gpu);
  if (!info.ok() || memory_bytes <= info->first) return memory_bytes;
  const int64_t slab = static_cast<int64_t>(memory.slab_bytes);
  const int64_t budget = info->first / slab * slab;
  if (budget <= 0) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "device ", name, ": its memory_mib asks for ", memory_bytes >> 20, " MiB, but only ",
        info->first >> 20, " MiB are free on it, less than one KV slab"));
  }
  spdlog::warn(
      "device {}: its memory_mib asks for {} MiB, but only {} MiB of its {} MiB are free: the "
      "node's budget on it is {} MiB",
      name, memory_bytes >> 20, info->first >> 20, info->second >> 20, budget >> 20);
  return budget;
}

DeviceWorker::DeviceWorker(std::string name, int64_t memory_bytes)
    : name_(std::move(name)), memory_bytes_(memory_bytes) {}

DeviceWorker::~DeviceWorker() { Stop(); }

void DeviceWorker::Stop() {
  {
    absl::MutexLock lock(&mu_);
    if (stop_) return;
    stop_ = true;
  }
  signal_->Bump();
  if (thread_.joinable()) thread_.join();  // not started if Create failed
  if (finishers_) finishers_->Stop();
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
  // The step thread is gone: closing here is on "the thread that steps".
  for (auto& [n, e] : engines) e->Close(absl::UnavailableError("node shutting down"));
  for (auto& e : retiring) e->Close(absl::UnavailableError("node shutting down"));
}

void DeviceWorker::Wake() { signal_->Bump(); }

absl::Status DeviceWorker::Add(std::shared_ptr<engine::ModelEngine> engine) {
  absl::MutexLock lock(&mu_);
  if (engines_.count(engine->name())) {
    return absl::AlreadyExistsError(absl::StrCat("model ", engine->name(), " already on ", name_));
  }
  if (balloon_) balloon_->SetWorkspace(engine->name(), engine->workspace_bytes());
  sheds_[engine->name()] = {engine->name()};
  added_at_[engine->name()] = ++adds_;
  engines_[engine->name()] = std::move(engine);
  signal_->Bump();  // lock order: mu_, then the signal's
  return absl::OkStatus();
}

bool DeviceWorker::Remove(const std::string& model) {
  absl::MutexLock lock(&mu_);
  auto it = engines_.find(model);
  if (it == engines_.end()) return false;
  retiring_.push_back(std::move(it->second));
  engines_.erase(it);
  added_at_.erase(model);
  if (balloon_) balloon_->SetWorkspace(model, 0);
  sheds_.erase(model);
  signal_->Bump();
  return true;
}

void DeviceWorker::AwaitRetired() {
  for (int i = 0; i < 2; ++i) {
    if (!RunOnStepThread([] { return absl::OkStatus(); }).ok()) return;  // stopping
  }
}

absl::Status DeviceWorker::RunOnStepThread(std::function<absl::Status()> fn) {
  absl::Status result;
  absl::Notification done;
  {
    absl::MutexLock lock(&mu_);
    if (stop_) return absl::UnavailableError(absl::StrCat("device ", name_, " is stopping"));
    tasks_.push_back([&](bool run) {
      result = run ? fn() : absl::UnavailableError(absl::StrCat("device ", name_, " stopped"));
      done.Notify();
    });
    signal_->Bump();
  }
  done.WaitForNotification();
  return result;
}

std::shared_ptr<engine::ModelEngine> DeviceWorker::Find(const std::string& model) const {
  absl::MutexLock lock(&mu_);
  auto it = engines_.find(model);
  return it == engines_.end() ? nullptr : it->second;
}

std::vector<std::shared_ptr<engine::ModelEngine>> DeviceWorker::Engines() const {
  absl::MutexLock lock(&mu_);
  return EnginesInOrder();
}

std::vector<std::shared_ptr<engine::ModelEngine>> DeviceWorker::EnginesInOrder() const {
  std::vector<std::pair<int64_t, std::shared_ptr<engine::ModelEngine>>> by;
  for (const auto& [n, e] : engines_) by.emplace_back(added_at_.at(n), e);
  std::sort(by.begin(), by.end(), [](const auto& a, const auto& b) { return a.first < b.first; });
  std::vector<std::shared_ptr<engine::ModelEngine>> out;
  for (auto& [at, e] : by) out.push_back(std::move(e));
  return out;
}

DeviceUsage DeviceWorker::Usage() const {
  DeviceUsage u;
  u.memory_total_bytes = memory_bytes_;
  for (const auto& e : Engines()) {
    const engine::EngineStats s = e->stats();
    if (!balloon_) {
      // Workspace is charged as in elastic mode (the balloon's), so both
      // modes account for the same real bytes.
      u.weight_bytes += e->weight_bytes();
      u.workspace_bytes += e->workspace_bytes();
      u.memory_used_bytes += e->weight_bytes() + e->options().kv_cache_bytes + e->workspace_bytes();
      u.kv_blocks_total += s.kv_blocks_total;
      u.kv_blocks_free += s.kv_blocks_free;
      u.kv_bytes_used +=
          e->kv_bytes() - s.kv_blocks_free * static_cast<int64_t>(e->kv_block_bytes());
      u.kv_bytes_free += s.kv_blocks_free * static_cast<int64_t>(e->kv_block_bytes());
    }
    u.waiting += s.waiting;
    u.running += s.running;
    u.preemptions += s.preemptions;
    u.models.push_back(e->name());
    u.model_preemptions.push_back({e->name(), s.preemptions - s.shed_preemptions, 0, 0});
    u.model_memory.push_back(
        {e->name(), e->weight_bytes(),
         (s.kv_blocks_total - s.kv_blocks_free) * static_cast<int64_t>(e->kv_block_bytes()),
         e->workspace_bytes()});
  }
  {
    absl::MutexLock lock(&mu_);
    u.step_host = step_host_;
    u.step_thread = thread_time_;
    u.step_starts = step_starts_;
    u.step_drains = step_drains_;
    u.kv_reclaims = reclaims_;
    u.arbitration = arb_stats_;
    u.kv_compactions = compactions_;
    for (ModelPreemptions& p : u.model_preemptions) {
      auto it = sheds_.find(p.model);
      if (it == sheds_.end()) continue;
      p.for_kv = it->second.for_kv;
      p.for_weights = it->second.for_weights;
    }
    if (remap_) u.remap = remap_->stats();
  }
  if (balloon_) {
    const memory::PagePoolStats ps = balloon_->pool()->stats();
    const memory::KvArenaStats as = balloon_->arena()->stats();
    const memory::BalloonStats bs = balloon_->stats();
    // Empty slabs the arena keeps mapped for quick reuse (Replenish, while
    // idle) are free memory: counting them made two idle devices differ by
    // a slab depending on when each last idled, which decided placement.
    // Each term comes from the one lock that guards it (the arena's slab
    // counts, the balloon's weights): the pool's mapped total, read apart
    // from the arena's counts, went negative by a slab when a heartbeat fell
    // inside a Replenish, and that node then won every placement.
    u.memory_used_bytes =
        bs.weight_bytes + bs.workspace_bytes +
        (as.slabs_mapped - as.slabs_empty) * static_cast<int64_t>(balloon_->arena()->slab_bytes());
    u.weight_bytes = bs.weight_bytes;
    u.workspace_bytes = bs.workspace_bytes;
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

ArbitrationStats DeviceWorker::arbitration_stats() const {
  absl::MutexLock lock(&mu_);
  return arb_stats_;
}

void DeviceWorker::FinishInFlight() {
  std::vector<InFlight> steps;
  steps.swap(in_flight_);
  FinishSteps(std::move(steps));
}

void DeviceWorker::Drain(int64_t StepDrains::*cause) {
  if (in_flight_.empty()) return;
  ++(drains_.*cause);
  FinishInFlight();
}

void DeviceWorker::DrainEngine(const engine::ModelEngine& e, int64_t StepDrains::*cause) {
  std::vector<InFlight> mine, rest;
  for (InFlight& f : in_flight_) (f.engine.get() == &e ? mine : rest).push_back(std::move(f));
  in_flight_ = std::move(rest);
  if (mine.empty()) return;
  ++(drains_.*cause);
  FinishSteps(std::move(mine));
}

void DeviceWorker::FinishOne(InFlight* f) {
  if (f->finished) return;
  // Nothing in flight: a failed step before it dropped this one too.
  const bool measured = f->engine->step_in_flight();
  f->engine->FinishStep();
  f->finished = true;
  f->ended = absl::Now();
  f->host_s = measured ? f->engine->last_step_host_seconds() : 0;
  f->prefill_tokens = measured ? f->engine->last_step_prefill_tokens() : 0;
}

void DeviceWorker::FinishSteps(std::vector<InFlight> steps) {
  const StepThreadClock::Activity was = clock_.Switch(&StepThreadTime::finish_s);
  // The steps' host halves (tokens to their streams, finished sequences,
  // exports) run in parallel, one engine per thread: each engine's steps
  // (two with ahead steps) are handed to one finisher, in order, while
  // this thread waits, so an engine is still touched by one thread at a
  // time; what engines share (the arena, the tiers, the sinks, the node's
  // counters) is thread-safe.
  std::vector<std::vector<InFlight*>> by_engine;
  for (InFlight& f : steps) {
    auto it = std::find_if(by_engine.begin(), by_engine.end(),
                           [&](const auto& g) { return g[0]->engine == f.engine; });
    if (it == by_engine.end()) {
      by_engine.push_back({&f});
    } else {
      it->push_back(&f);
    }
  }
  if (by_engine.size() > 1 && finishers_) {
    // Not absl::BlockingCounter: ThreadSanitizer cannot see it order the
    // finishers' work before Wait returns (transfer/latch.h).
    std::shared_ptr<transfer::Latch> left =
        transfer::Latch::Create(static_cast<int64_t>(by_engine.size()) - 1);
    for (size_t i = 1; i < by_engine.size(); ++i) {
      std::vector<InFlight*>* group = &by_engine[i];
      auto finish = [group, left] {
        for (InFlight* f : *group) FinishOne(f);
        left->CountDown();
      };
      if (!finishers_->Schedule(finish)) finish();  // the pool is stopping
    }
    for (InFlight* f : by_engine[0]) FinishOne(f);
    left->Wait();
  }
  finished_steps_ += static_cast<int64_t>(steps.size());
  // Decode-step timing: a step that shared the device with no other model's.
  const bool alone = by_engine.size() == 1 &&
                     std::all_of(in_flight_.begin(), in_flight_.end(),
                                 [&](const InFlight& f) { return f.engine == steps[0].engine; });
  for (InFlight& f : steps) {
    FinishOne(&f);  // no-op if finished above
    // The engine's next step (ahead) starts on the device about now.
    for (InFlight* next = &f + 1; next < steps.data() + steps.size(); ++next) {
      if (next->engine == f.engine) {
        next->began = std::max(next->began, f.ended);
        break;
      }
    }
    for (InFlight& next : in_flight_) {
      if (next.engine == f.engine) next.began = std::max(next.began, f.ended);
    }
    const double ms = absl::ToDoubleMilliseconds(f.ended - f.began);
    {
      absl::MutexLock lock(&mu_);
      step_host_.Add(f.host_s);
      if (alone && !f.overlapped && f.prefill_tokens == 0) {
        auto [it, fresh] = decode_step_ms_.try_emplace(f.engine->name(), ms);
        if (!fresh) it->second += 0.2 * (ms - it->second);
      }
    }
    if (f.prefill_tokens > 0) {
      costs_.try_emplace(f.engine->name()).first->second.Record(f.prefill_tokens, ms);
    }
  }
  clock_.Switch(was);
}

double DeviceWorker::DecodeStepMs(const std::string& model) const {
  absl::MutexLock lock(&mu_);
  auto it = decode_step_ms_.find(model);
  return it == decode_step_ms_.end() ? 0 : it->second;
}

void DeviceWorker::Loop() {
  while (true) {
    const int64_t seen = signal_->Events();  // before this iteration looks at anything
    std::vector<std::shared_ptr<engine::ModelEngine>> engines, retiring;
    std::vector<std::function<void(bool)>> tasks;
    {
      absl::MutexLock lock(&mu_);
      thread_time_ += clock_.Take();
      step_starts_ += std::exchange(starts_, {});
      step_drains_ += std::exchange(drains_, {});
      if (stop_) return;
      tasks.swap(tasks_);
    }
    for (auto& t : tasks) t(true);  // between steps: engines are quiescent
    {
      absl::MutexLock lock(&mu_);
      if (stop_) return;
      engines = EnginesInOrder();
      retiring.swap(retiring_);
    }
    for (auto& e : retiring) {
      // Closed, not just aborted: a Submit that found this engine before
      // Remove now fails instead of waiting for a step that never comes.
      e->Close(absl::UnavailableError(absl::StrCat("model ", e->name(), " was evicted")));
    }
    retiring.clear();
    if (remap_) remap_->NoteEngines(engines);
    // Remapping's reversion and counters, with no step in flight.
    if (remap_) TickRemap(engines, absl::Now());
    // Every engine with work begins its step (arbitration order: the most
    // urgent is queued on the device first), then each is finished in the
    // same order. The engines' forwards run on their own streams, so they
    // overlap on the device with each other and with the host work of the
    // steps around them.
    const bool did = BeginSteps(std::move(engines));
    FinishInFlight();
    if (!did) {
      if (balloon_) balloon_->arena()->Replenish();  // idle: get the next slabs ready
      clock_.Switch(&StepThreadTime::idle_s);
      signal_->AwaitChange(seen, absl::Milliseconds(50));  // also wakes to replenish
      clock_.Switch(&StepThreadTime::other_s);
    }
  }
}

bool DeviceWorker::BeginSteps(std::vector<std::shared_ptr<engine::ModelEngine>> engines) {
  const StepThreadClock::Activity was = clock_.Switch(&StepThreadTime::begin_s);
  // Every engine's queue takes part in the arbitration (its hooks leave
  // steps in flight running); those with a step in flight (rolling) begin
  // no other here (BeginAheadSteps may queue one behind it).
  std::vector<const engine::ModelEngine*> flying;
  for (const InFlight& f : in_flight_) flying.push_back(f.engine.get());
  auto is_flying = [&](const std::shared_ptr<engine::ModelEngine>& e) {
    return std::find(flying.begin(), flying.end(), e.get()) != flying.end();
  };
  StepOrder order = Arbitrate(std::move(engines));
  // Several steps overlapping: some may run at the greatest priority.
  const size_t stepping =
      flying.size() + static_cast<size_t>(std::count_if(
                          order.engines.begin(), order.engines.end(),
                          [&](const auto& e) { return !is_flying(e) && e->HasWork(); }));
  const StreamPriorityPolicy prio = arbitration_.overlap_steps && stepping > 1
                                        ? arbitration_.priority_streams
                                        : StreamPriorityPolicy::kNone;
  bool did = false;
  for (size_t i = 0; i < order.engines.size(); ++i) {
    const std::shared_ptr<engine::ModelEngine>& e = order.engines[i];
    if (is_flying(e) || !e->HasWork()) continue;
    const absl::Time t0 = absl::Now();
    using engine::StepUrgency;
    const StepUrgency urgency =
        prio == StreamPriorityPolicy::kDecode ? StepUrgency::kUrgentIfDecodeOnly
        : prio == StreamPriorityPolicy::kFirst && i == 0 && order.first_holds_first
            ? StepUrgency::kUrgent
            : StepUrgency::kDefault;
    const int64_t urgent_before = e->urgent_steps();
    if (!e->BeginStep(urgency)) continue;
    did = true;
    if (e->urgent_steps() != urgent_before) {
      absl::MutexLock lock(&mu_);
      ++arb_stats_.urgent_steps;
    }
    if (remap_) remap_->NoteActive(e->name());
    ++starts_.alone;
    const bool overlapped = !in_flight_.empty();
    for (InFlight& f : in_flight_) f.overlapped = true;
    InFlight f = Began(e, t0);
    f.overlapped = overlapped;
    in_flight_.push_back(std::move(f));
    if (!arbitration_.overlap_steps) FinishInFlight();
  }
  if (arbitration_.overlap_steps && arbitration_.rolling_steps && arbitration_.ahead_steps) {
    did |= BeginAheadSteps();
  }
  clock_.Switch(was);
  return did;
}

}  // namespace ballast::node_manager
