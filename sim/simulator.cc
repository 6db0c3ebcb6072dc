#include "sim/simulator.h"

#include <algorithm>
#include <chrono>
#include <cstdint>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "sim/simulator_impl.h"

namespace ballast::sim {

Simulator::Simulator(const SimConfig& config, const EngineModel& engine,
                     const std::vector<bench::TraceRecord>& trace, double rate_scale,
                     bool record_steps)
    : config_(config),
      engine_(engine),
      trace_(trace),
      rate_scale_(rate_scale),
      record_steps_(record_steps) {
  const int total = config.cluster.gpus > 0 ? config.cluster.gpus
                                            : config.cluster.nodes * config.cluster.gpus_per_node;
  for (int n = 0; n < config.cluster.nodes; ++n) {
    for (int g = 0; g < config.cluster.gpus_per_node && static_cast<int>(devices_.size()) < total;
         ++g) {
      const int d = static_cast<int>(devices_.size());
      devices_.push_back(std::make_unique<SimDevice>(
          absl::StrFormat("node-%04d", n), absl::StrCat("gpu:", g), config.cluster.gpu_memory_bytes,
          &config, &engine, &events_, HooksFor(d)));
    }
  }
  for (size_t d = 0; d < devices_.size(); ++d) {
    if (d == 0 || devices_[d]->node_id() != devices_[d - 1]->node_id()) ++node_count_;
    node_of_.push_back(node_count_ - 1);
  }
  for (int n = 0; n < node_count_; ++n) {
    tiers_.push_back(
        Tiers() ? std::make_unique<SimKvTiers>(config.cluster.dram_bytes, config.cluster.ssd_bytes)
                : std::make_unique<SimKvTiers>(0, 0));
  }
  models_.resize(config.models.size());
  for (size_t m = 0; m < config.models.size(); ++m) {
    model_index_[config.models[m].name] = static_cast<int>(m);
    const int b = SimPolicy::kNominalBatch;
    nominal_step_.push_back(
        TpStepSeconds(engine, config.policy, config.models[m], {b, b * 1024.0, 0, 0}));
  }
  stats_.gpus = static_cast<int>(devices_.size());
  stats_.models = static_cast<int>(models_.size());
  requests_.resize(trace.size());
  outcomes_.resize(trace.size());
  dependents_.resize(trace.size());
}

SimDevice::Hooks Simulator::HooksFor(int d) {
  SimDevice::Hooks h;
  h.outstanding = [this] { return outstanding_ > 0; };
  h.done = [this](SimRequest* r) { Done(r); };
  h.drained = [this, d](int m) { Drained(d, m); };
  if (record_steps_) {
    h.step = [this, d](const SimStepRecord& rec) { steps_.push_back({d, rec}); };
    h.arbitration = [this, d](double now, const node_manager::ArbitrationEvent& ev,
                              int64_t kv_free) {
      SimArbitrationRow row{d, now, ev, kv_free};
      int i = 0;
      if (absl::SimpleAtoi(ev.entry.id, &i)) row.event.entry.id = trace_[static_cast<size_t>(i)].id;
      arbitration_.push_back(std::move(row));
    };
  }
  auto members = [this, d](int m) -> const std::vector<int>* {
    const ModelState& ms = models_[static_cast<size_t>(m)];
    auto it = ms.members.find(d);
    return it == ms.members.end() ? nullptr : &it->second;
  };
  h.group_fits = [this, members](int m, int64_t bytes) {
    const std::vector<int>* others = members(m);
    if (others == nullptr) return true;
    return std::all_of(others->begin(), others->end(), [&](int x) {
      return devices_[static_cast<size_t>(x)]->ShadowFits(m, bytes);
    });
  };
  h.group_kv = [this, members](int m, int64_t bytes) {
    if (const std::vector<int>* others = members(m); others != nullptr) {
      for (int x : *others) devices_[static_cast<size_t>(x)]->TakeShadowKv(m, bytes);
    }
  };
  auto leader = [this, d](int m) -> SimDevice* {
    const ModelState& ms = models_[static_cast<size_t>(m)];
    auto it = ms.leader_of.find(d);
    return it == ms.leader_of.end() ? nullptr : devices_[static_cast<size_t>(it->second)].get();
  };
  h.lead_work = [leader](int m) {
    const SimDevice* l = leader(m);
    return l == nullptr ? StepWork{} : l->LastTpWork(m);
  };
  h.lead_steps = [leader](int m) {
    const SimDevice* l = leader(m);
    return l == nullptr ? int64_t{0} : l->TpSteps(m);
  };
  h.members_steps = [this, members](int m) {
    const std::vector<int>* others = members(m);
    int64_t fewest = INT64_MAX;
    if (others == nullptr) return fewest;
    for (int x : *others) fewest = std::min(fewest, devices_[static_cast<size_t>(x)]->TpSteps(m));
    return fewest;
  };
  h.stepped = [this, members, leader](int m) {
    if (SimDevice* l = leader(m); l != nullptr) l->Wake();
    if (const std::vector<int>* others = members(m); others != nullptr) {
      for (int x : *others) devices_[static_cast<size_t>(x)]->Wake();
    }
  };
  return h;
}

SimResult Simulator::Run() {
  const auto wall0 = std::chrono::steady_clock::now();
  PlaceInitial();
  std::map<std::string, int> index;
  double last_release = 0;
  for (size_t i = 0; i < trace_.size(); ++i) {
    const bench::TraceRecord& rec = trace_[i];
    index[rec.id] = static_cast<int>(i);
    if (rec.is_request()) {
      ++outstanding_;
      outcomes_[i].id = rec.id;
      outcomes_[i].model = rec.model;
      outcomes_[i].session = rec.session;
      outcomes_[i].turn = rec.turn;
    } else {
      ++advisories_;
      if (rec.session.empty() || config_.policy.session_kv == SessionKv::kRecompute) {
        ++stats_.advisories_ignored;
      }
    }
    if (!rec.after.empty()) {
      dependents_[static_cast<size_t>(index.at(rec.after))].push_back(static_cast<int>(i));
      continue;
    }
    const double t = rec.arrival_s / rate_scale_;
    last_release = std::max(last_release, t);
    events_.At(t, [this, i] { Release(static_cast<int>(i)); });
  }
  ScheduleTick();
  stats_.events = RunEvents(last_release + config_.drain_s);
  bench::ReplayResult out;
  out.rate_scale = rate_scale_;
  double end = 0;
  for (size_t i = 0; i < trace_.size(); ++i) {
    if (!trace_[i].is_request()) continue;
    bench::RequestOutcome& o = outcomes_[i];
    if (o.status == "NOT_SENT" || o.status == "RUNNING") {
      if (o.status == "RUNNING") ++stats_.unfinished;
      o.status = "DEADLINE_EXCEEDED";
      o.message = "not finished when the simulation ended (drain_s after the last arrival)";
    }
    end = std::max(end, o.end_s);
    out.requests.push_back(o);
  }
  out.trace_requests = static_cast<int>(out.requests.size());
  out.wall_s = end;
  for (const SimModel& m : config_.models) out.model_slos[m.name] = {m.ttft_ms, m.tpot_ms};
  stats_.simulated_s = last_event_;
  for (const auto& d : devices_) {
    stats_.model_steps += d->model_steps();
    stats_.device_model_steps.push_back(d->model_steps());
  }
  SummarizeSessions();
  for (const auto& d : devices_) {
    stats_.remap.Add(d->remap_counters());
    stats_.preemptions += d->kv_counters().preemptions;
    stats_.recomputed_tokens += d->kv_counters().recomputed_tokens;
    stats_.victim_drains += d->kv_counters().victim_drains;
    stats_.victim_drain_s += d->kv_counters().victim_drain_s;
    stats_.kv_bytes_at_end += d->kv_used();
  }
  if (config_.policy.remap.enabled) {
    stats_.remap_json = RemapJson(config_.policy.remap, stats_.remap, config_);
  }
  out.advisories_sent = stats_.sessions.advisories;  // the ones the simulator acted on
  // The rest: ignored, or never released (a dependency failed or never
  // ended), as a replay skips them.
  out.advisories_skipped = advisories_ - out.advisories_sent;
  stats_.wall_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - wall0).count();
  return SimResult{std::move(out), stats_, std::move(steps_), std::move(arbitration_)};
}

int64_t Simulator::RunEvents(double until) {
  int64_t n = 0;
  while (!events_.empty() && events_.next_time() <= until) {
    const double t = events_.next_time();
    const int64_t expiries = expiries_run_;
    const int64_t ran = events_.RunUntil(t);  // every event at t
    if (ran > expiries_run_ - expiries) last_event_ = t;
    n += ran;
  }
  return n;
}

void Simulator::Release(int i) {
  const bench::TraceRecord& rec = trace_[static_cast<size_t>(i)];
  if (!rec.is_request()) {  // an advisory: it ends at once (as in a replay)
    if (!rec.session.empty() && config_.policy.session_kv != SessionKv::kRecompute) Advise(i);
    ReleaseDependents(i, true);
    return;
  }
  bench::RequestOutcome& o = outcomes_[static_cast<size_t>(i)];
  const double now = events_.now();
  o.ttft_slo_ms = rec.ttft_ms;
  o.tpot_slo_ms = rec.tpot_ms;
  o.release_s = o.send_s = now;
  o.status = "RUNNING";
  auto it = model_index_.find(rec.model);
  if (it == model_index_.end()) {
    Fail(i, "NOT_FOUND", absl::StrCat("model \"", rec.model, "\" is not in the catalogue"));
    return;
  }
  const SimModel& spec = config_.models[static_cast<size_t>(it->second)];
  auto r = std::make_unique<SimRequest>();
  r->index = i;
  r->model = it->second;
  r->release = now;
  r->prompt = rec.prompt_tokens > 0 ? rec.prompt_tokens : static_cast<int>(rec.prompt.size());
  r->prompt = std::max(r->prompt, 1);
  r->output = rec.output_tokens;
  r->priority = rec.priority;
  if (!rec.session.empty()) {  // the scheduler sends the history before the turn's own tokens
    r->session = SessionFor(rec.session);
    r->history = sessions_[static_cast<size_t>(r->session)].history;
    r->prompt += r->history;
  }
  o.prompt_tokens = r->prompt;
  r->deadline = now + (rec.ttft_ms > 0 ? rec.ttft_ms : spec.ttft_ms) / 1e3;
  // KV per GPU (a tensor-parallel part's share on each of its group's).
  r->kv_bytes = static_cast<int64_t>(r->prompt + r->output) * spec.Part().kv_bytes_per_token();
  ModelState& ms = models_[static_cast<size_t>(r->model)];
  ms.last_request = now;
  ms.window.push_back({now, r->prompt, r->output});
  ms.window_prompt += r->prompt;
  ms.window_output += r->output;
  requests_[static_cast<size_t>(i)] = std::move(r);
  Route(requests_[static_cast<size_t>(i)].get());
}

int Simulator::NodeLoad(int d) const {
  const std::string& node = devices_[static_cast<size_t>(d)]->node_id();
  int load = 0;  // a node's devices are contiguous
  for (int i = d; i >= 0 && devices_[static_cast<size_t>(i)]->node_id() == node; --i) {
    load += devices_[static_cast<size_t>(i)]->Requests();
  }
  for (size_t i = static_cast<size_t>(d) + 1; i < devices_.size() && devices_[i]->node_id() == node;
       ++i) {
    load += devices_[i]->Requests();
  }
  return load;
}

int Simulator::PickReplica(const SimRequest& r, int64_t* ready_capacity) const {
  const std::vector<int>& replicas = models_[static_cast<size_t>(r.model)].devices;
  *ready_capacity = -1;
  int target = -1, target_load = 0, loading = -1;
  for (int d : replicas) {
    const SimDevice& dev = *devices_[static_cast<size_t>(d)];
    const ModelPhase phase = dev.phase(r.model);
    if (phase == ModelPhase::kLoading && (loading < 0 || d < loading)) loading = d;
    if (phase != ModelPhase::kReady) continue;
    const int64_t capacity = dev.KvCapacity(r.model);
    *ready_capacity = std::max(*ready_capacity, capacity);
    if (r.kv_bytes > capacity) continue;
    const int load = replicas.size() > 1 ? NodeLoad(d) : 0;
    if (target < 0 || load < target_load || (load == target_load && d < target)) {
      target = d;
      target_load = load;
    }
  }
  // A session's turn goes to its affinity GPU while that one can serve it.
  const int a = r.session >= 0 ? sessions_[static_cast<size_t>(r.session)].device : -1;
  if (a >= 0 && std::find(replicas.begin(), replicas.end(), a) != replicas.end() &&
      devices_[static_cast<size_t>(a)]->phase(r.model) == ModelPhase::kReady &&
      r.kv_bytes <= devices_[static_cast<size_t>(a)]->KvCapacity(r.model)) {
    return a;
  }
  return target >= 0 ? target : loading;
}

void Simulator::Route(SimRequest* r) {
  ModelState& ms = models_[static_cast<size_t>(r->model)];
  const SimModel& spec = config_.models[static_cast<size_t>(r->model)];
  int64_t ready_capacity = -1;
  const int target = PickReplica(*r, &ready_capacity);
  const int64_t capacity =
      target >= 0 ? devices_[static_cast<size_t>(target)]->KvCapacity(r->model) : ready_capacity;
  if (capacity >= 0 && r->kv_bytes > capacity) {
    Fail(r->index, "RESOURCE_EXHAUSTED",
         absl::StrFormat("prompt + output need %.1f MiB of KV; a GPU holds at most %.1f MiB "
                         "for model %s",
                         r->kv_bytes / 1048576.0, capacity / 1048576.0, spec.name));
    return;
  }
  if (target >= 0) {
    Arrive(r, target);
    // A model short of replicas gets the next one placed.
    if (!config_.policy.fixed()) Activate(r->model);
    return;
  }
  if (config_.policy.fixed()) {
    Fail(r->index, "UNAVAILABLE",
         absl::StrCat("model ", spec.name, " has no replica (the fixed placement put it nowhere)"));
    return;
  }
  ms.waiting.push_back(r);
  Activate(r->model);
}

void Simulator::Done(SimRequest* r) {
  bench::RequestOutcome& o = outcomes_[static_cast<size_t>(r->index)];
  // Tokens reach the client request_path_s after their step (the RPCs and
  // relay outside the engine); the engine's own TTFT runs from its arrival.
  const double path = config_.policy.request_path_s;
  o.first_token_s = r->first_token + path;
  o.end_s = r->end + path;
  o.node_ttft_ms = (r->first_token - r->release) * 1e3;
  o.output_tokens = r->output;
  o.any_token = true;
  o.status = "OK";
  o.server_queue_ms = (r->admitted - r->release) * 1e3;
  o.preemptions = r->preemptions;
  FillKvOutcome(*r, &o);
  TurnEnded(*r);
  ++changes_;
  --outstanding_;
  ReleaseDependents(r->index, true, path);
}

void Simulator::Fail(int i, const std::string& status, const std::string& message) {
  bench::RequestOutcome& o = outcomes_[static_cast<size_t>(i)];
  o.status = status;
  o.message = message;
  o.end_s = events_.now() + config_.policy.request_path_s;  // when the client hears of it
  --outstanding_;
  ReleaseDependents(i, false);
}

void Simulator::ReleaseDependents(int i, bool ok, double seen_after_s) {
  for (int j : dependents_[static_cast<size_t>(i)]) {
    const bench::TraceRecord& rec = trace_[static_cast<size_t>(j)];
    if (ok) {
      events_.At(events_.now() + seen_after_s + rec.delay_s, [this, j] { Release(j); });
      continue;
    }
    if (!rec.is_request()) {  // a skipped advisory: its dependents fail too
      ReleaseDependents(j, false);
      continue;
    }
    bench::RequestOutcome& o = outcomes_[static_cast<size_t>(j)];
    o.status = "ABORTED";
    o.message = absl::StrCat("its dependency ", trace_[static_cast<size_t>(i)].id, " failed");
    --outstanding_;
    ReleaseDependents(j, false);
  }
}

void Simulator::ScheduleTick() {
  if (tick_scheduled_) return;
  tick_scheduled_ = true;
  events_.At(events_.now() + config_.policy.control_interval_s, [this] {
    tick_scheduled_ = false;
    Tick();
    if (outstanding_ > 0) ScheduleTick();
  });
}

absl::StatusOr<SimResult> Simulate(const SimConfig& config, const EngineModel& engine,
                                   const std::vector<bench::TraceRecord>& trace, double rate_scale,
                                   bool record_steps) {
  if (config.cluster.nodes <= 0 || config.cluster.gpus_per_node <= 0 ||
      config.cluster.gpu_memory_bytes <= 0) {
    return absl::InvalidArgumentError("cluster: nodes, gpus_per_node and GPU memory must be > 0");
  }
  if (config.models.empty()) return absl::InvalidArgumentError("models: the catalogue is empty");
  for (const SimModel& m : config.models) {
    if (m.replicas < 1) {
      return absl::InvalidArgumentError(absl::StrCat("model ", m.name, ": replicas must be >= 1"));
    }
    if (m.tp < 1 || m.tp > config.cluster.gpus_per_node || m.shape.heads % m.tp != 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          "model ", m.name, ": tp ", m.tp, " must be >= 1, at most gpus_per_node (",
          config.cluster.gpus_per_node, ") and divide its ", m.shape.heads, " attention heads"));
    }
  }
  if (rate_scale <= 0) return absl::InvalidArgumentError("rate_scale must be > 0");
  if (config.policy.control_interval_s <= 0) {
    return absl::InvalidArgumentError("policy.control_interval_s must be > 0");
  }
  if (config.cluster.dram_bytes < 0) {
    return absl::InvalidArgumentError("cluster.dram_gib must be >= 0 (0: no DRAM tier)");
  }
  if (config.cluster.ssd_bytes < 0) {
    return absl::InvalidArgumentError("cluster.ssd_gib must be >= 0 (0: no SSD tier)");
  }
  Simulator sim(config, engine, trace, rate_scale, record_steps);
  return sim.Run();
}

std::vector<bench::TraceRecord> JitterArrivals(const std::vector<bench::TraceRecord>& trace,
                                               double jitter_s, double rate_scale, uint64_t seed) {
  std::vector<bench::TraceRecord> out = trace;
  if (!(jitter_s > 0)) return out;
  // splitmix64: the same draws on every platform (std's distributions are
  // implementation-defined).
  uint64_t state = seed;
  auto uniform = [&state] {  // in [0, 1)
    uint64_t z = (state += 0x9e3779b97f4a7c15ULL);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    z ^= z >> 31;
    return static_cast<double>(z >> 11) * 0x1.0p-53;
  };
  for (bench::TraceRecord& r : out) {
    if (!r.is_request() || !r.after.empty()) continue;
    const double shift = (2 * uniform() - 1) * jitter_s * rate_scale;
    r.arrival_s = std::max(0.0, r.arrival_s + shift);
  }
  return out;
}

std::string StepsCsv(const SimConfig& config, const std::vector<SimStepRow>& steps) {
  std::string out =
      "gpu,model,start_s,end_s,steps,decode_tokens,decode_context,prefill_tokens,"
      "prefill_attention,prefill_logits,running,waiting,kv_bytes,lent_layers,device_lent\n";
  for (const SimStepRow& row : steps) {
    const SimStepRecord& s = row.step;
    const StepWork& w = s.work;
    absl::StrAppendFormat(&out, "%d,%s,%.6f,%.6f,%d,%d,%.0f,%d,%.0f,%d,%d,%d,%d,%d,%d\n", row.gpu,
                          config.models[static_cast<size_t>(s.model)].name, s.start_s, s.end_s,
                          s.steps, w.decode_tokens, w.decode_context, w.prefill_tokens,
                          w.prefill_attention, w.prefill_logits, s.running, s.waiting, s.kv_bytes,
                          s.lent_layers, s.device_lent);
  }
  return out;
}

std::string ArbitrationCsv(const std::vector<SimArbitrationRow>& rows) {
  std::string out =
      "gpu,t_s,request,model,event,tokens,arrival_ms,start_ms,deadline_ms,cost_ms,queued_ms,"
      "fit_ms,fit_ms_per_token,fit_steps,kv_free_mib\n";
  for (const SimArbitrationRow& row : rows) {
    const node_manager::ArbitrationEntry& e = row.event.entry;
    absl::StrAppendFormat(&out, "%d,%.6f,%s,%s,%s,%d,%.3f,%.3f,%.3f,%.3f,%.3f,%.3f,%.6f,%d,%d\n",
                          row.gpu, row.t_s, e.id, e.model,
                          node_manager::ArbitrationChangeName(row.event.change), e.tokens,
                          e.arrival_s * 1e3, e.start_s * 1e3, e.deadline_s * 1e3, e.cost_s * 1e3,
                          row.event.queued_s * 1e3, e.fit_intercept_ms, e.fit_ms_per_token,
                          e.fit_steps, row.kv_free >> 20);
  }
  return out;
}

nlohmann::json ToJson(const SimStats& s) {
  nlohmann::json j = {{"gpus", s.gpus},
                      {"models", s.models},
                      {"simulated_s", s.simulated_s},
                      {"wall_s", s.wall_s},
                      {"events", s.events},
                      {"model_steps", s.model_steps},
                      {"initial_placed", s.initial_placed},
                      {"activations", s.activations},
                      {"idle_evictions", s.idle_evictions},
                      {"kv_pressure_evictions", s.kv_pressure_evictions},
                      {"load_refusals", s.load_refusals},
                      {"migrations", s.migrations},
                      {"advisories_ignored", s.advisories_ignored},
                      {"unfinished", s.unfinished},
                      {"kv_wait_requests", s.remap.kv_wait_requests},
                      {"preemptions", s.preemptions},
                      {"recomputed_tokens", s.recomputed_tokens},
                      {"victim_drains", s.victim_drains},
                      {"victim_drain_s", s.victim_drain_s}};
  if (s.sessions.sessions > 0) j["session_kv"] = ToJson(s.sessions);
  if (!s.remap_json.is_null()) j["remap"] = s.remap_json;
  return j;
}

}  // namespace ballast::sim
