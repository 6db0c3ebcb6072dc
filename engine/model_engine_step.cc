// ModelEngine's step path (split from model_engine.cc): one step — drain
// the inbox, plan, load leased KV, run the executor, stream the tokens and
// finish sequences — and the failure paths. Runs on the device's step
// thread (model_engine.h states the threading contract).
#include <algorithm>

#include "absl/strings/str_cat.h"
#include "engine/kv_export.h"
#include "engine/model_engine.h"
#include "spdlog/spdlog.h"

namespace ballast::engine {
namespace {
double Ms(absl::Duration d) { return absl::ToDoubleMilliseconds(d); }
}  // namespace

bool ModelEngine::Step() {
  FinishAllSteps();
  if (!BeginStep()) return false;
  FinishStep();
  return true;
}

bool ModelEngine::CanBeginAhead() const {
  if (flight_.size() != 1 || drain_ || !flight_.front().launched) return false;
  if (!executor_->samples_on_device() || executor_->max_started_steps() < 2) return false;
  if (remapper_ && remapper_->alpha() > 0) return false;
  {
    absl::MutexLock lock(&mu_);
    if (!tasks_.empty()) return false;  // they wait for no step in flight
  }
  for (const auto& s : planner_->running()) {
    if (s->req.params.sampling.has_penalties()) return false;
  }
  return true;
}

bool ModelEngine::BeginStep(StepUrgency urgency) {
  const bool ahead = !flight_.empty();
  if (ahead && !CanBeginAhead()) return false;
  StepInFlight step;
  absl::Time at[5];
  at[0] = absl::Now();
  step.began = at[0];
  DrainInbox();
  at[1] = absl::Now();
  if (!ahead) drain_ = false;
  const double reclaim_before = reclaim_ms_;
  step.plan = planner_->empty() ? StepPlan{} : planner_->Plan(ahead);
  step.phase_ms[6] = reclaim_ms_ - reclaim_before;
  drain_ |= step.plan.drain;
  if (step.plan.empty()) {
    PublishStats();
    return false;
  }
  at[2] = absl::Now();
  step.id = next_step_id_++;
  step.ahead = ahead;
  ahead_steps_ += ahead;
  const bool urgent =
      urgency == StepUrgency::kUrgent ||
      (urgency == StepUrgency::kUrgentIfDecodeOnly && step.plan.prefill_tokens == 0);
  // Only with no step in flight may the executor switch streams.
  if (!ahead && urgent != urgent_) {
    if (absl::Status st = executor_->SetUrgent(urgent); st.ok()) {
      urgent_ = urgent;
    } else {
      spdlog::warn("model {}: stream priority not changed: {}", options_.name, st.ToString());
    }
  }
  urgent_steps_ += urgent_;
  step.status = RunLoads(step.plan);
  at[3] = absl::Now();
  step.launch_began = at[3];
  if (step.status.ok()) step.status = Launch(&step);
  at[4] = absl::Now();
  for (int p = 0; p < 4; ++p) step.phase_ms[p] = Ms(at[p + 1] - at[p]);
  if (step.launched) Advance(step);
  flight_.push_back(std::move(step));
  return true;
}

void ModelEngine::Advance(const StepInFlight& step) {
  int row = 0;
  for (const PlannedChunk& c : step.plan.chunks) {
    Sequence* s = c.seq;
    s->num_computed += c.tokens;
    if (!c.logits) continue;
    s->tokens.push_back(kPendingToken);
    s->pending_step = step.id;
    s->pending_row = row++;
  }
}

void ModelEngine::NotifyWhenDeviceDone(std::function<void()> done) {
  if (!flight_.empty() && flight_.back().launched && executor_->samples_on_device()) {
    executor_->NotifyWhenStepDone(std::move(done));
  } else {
    done();
  }
}

bool ModelEngine::StepDeviceEnded() const {
  if (flight_.empty() || !flight_.back().launched || !executor_->samples_on_device()) return true;
  return executor_->StartedStepsEnded();
}

bool ModelEngine::OldestStepDeviceEnded() const {
  if (flight_.empty() || !flight_.front().launched || !executor_->samples_on_device()) return true;
  return executor_->OldestStartedStepEnded();
}

void ModelEngine::FinishAllSteps() {
  while (!flight_.empty()) FinishStep();
}

bool ModelEngine::InFlight(const Sequence* seq) const {
  for (const StepInFlight& f : flight_) {
    for (const PlannedChunk& c : f.plan.chunks) {
      if (c.seq == seq) return true;
    }
  }
  return false;
}

void ModelEngine::Retire(std::unique_ptr<Sequence> seq, absl::Status status) {
  if (InFlight(seq.get())) {
    seq->done = true;  // the steps in flight drop its rows
    retired_.emplace_back(std::move(seq), std::move(status));
  } else if (status.ok()) {
    Finish(std::move(seq));
  } else {
    Fail(std::move(seq), status);
  }
}

void ModelEngine::RetireReady() {
  for (size_t i = 0; i < retired_.size();) {
    if (InFlight(retired_[i].first.get())) {
      ++i;
      continue;
    }
    auto [seq, status] = std::move(retired_[i]);
    retired_.erase(retired_.begin() + static_cast<std::ptrdiff_t>(i));
    Retire(std::move(seq), std::move(status));
  }
}

void ModelEngine::FinishStep() {
  if (flight_.empty()) return;
  StepInFlight step = std::move(flight_.front());
  flight_.pop_front();
  export_times_ = {};
  const absl::Time t0 = absl::Now();
  if (step.launched || (step.status.ok() && !executor_->samples_on_device())) {
    absl::Status collected = Collect(&step);
    if (step.status.ok()) step.status = std::move(collected);
  }
  const absl::Time t1 = absl::Now();
  step.phase_ms[5] = Ms(t1 - t0);
  ++steps_;
  last_prefill_tokens_ = step.plan.prefill_tokens;
  // Launch + wait is the forward's time only for a step alone on the
  // model's stream: an ahead step's wait misses its start, and a step with
  // one queued behind it was waited for late.
  if (remapper_ && step.status.ok() && !step.ahead && flight_.empty()) {
    remapper_->ObserveForward((step.phase_ms[3] + step.phase_ms[5]) / 1e3,
                              step.plan.prefill_tokens == 0);
  }
  if (!step.status.ok()) {
    // A later step read this one's tokens: it is dropped too (its end
    // still waited for, as are loads a failed step did not finish, before
    // the blocks are freed).
    while (!flight_.empty()) {
      StepInFlight later = std::move(flight_.front());
      flight_.pop_front();
      if (later.launched) Collect(&later).IgnoreError();
      if (!later.plan.loads.empty()) executor_->WaitKvLoad().IgnoreError();
    }
    if (!step.plan.loads.empty()) executor_->WaitKvLoad().IgnoreError();
    // Every request of the model fails with it: say so once, with why (on
    // the H200, 57 requests once failed INTERNAL with no line in the log).
    spdlog::error("model {}: a step of {} chunk(s) failed ({}); its requests fail with it",
                  options_.name, step.plan.chunks.size(), step.status.ToString());
    AbortAll(step.status);
    PublishStats();
  } else {
    if (!step.launched) Advance(step);  // host sampling: computed in Collect
    TakeTokens(step);
    PublishStats();
  }
  step.phase_ms[4] = Ms(absl::Now() - t1);
  // Host time: everything but the forward (its launch and its wait).
  last_step_host_s_ =
      (step.phase_ms[0] + step.phase_ms[1] + step.phase_ms[2] + step.phase_ms[4]) / 1e3;
  double total_ms = 0;
  for (double ms : step.phase_ms) total_ms += ms;
  if (options_.slow_step_warn_ms > 0 && total_ms >= options_.slow_step_warn_ms) {
    LogSlowStep(step, total_ms, t1);
  }
}

void ModelEngine::TakeTokens(StepInFlight& step) {
  size_t row = 0;
  for (const PlannedChunk& c : step.plan.chunks) {
    if (!c.logits) continue;
    Sequence* s = c.seq;
    // Done already (an earlier step's token ended it, or it was
    // cancelled): this ahead row computed for nothing.
    if (!s->done) {
      const bool want = s->req.params.sampling.top_logprobs >= 0 && row < step.logprobs.size();
      AfterToken(s, step.id, static_cast<size_t>(c.start + c.tokens), step.sampled[row],
                 want ? &step.logprobs[row] : nullptr);
    }
    ++row;
  }
  for (auto& s : planner_->TakeDone()) Retire(std::move(s), absl::OkStatus());
  RetireReady();
}

void ModelEngine::LogSlowStep(const StepInFlight& step, double total_ms,
                              absl::Time collected) const {
  auto ms = [&](int i) { return step.phase_ms[i]; };
  const StepPlan& plan = step.plan;
  const ExportTimes& e = export_times_;
  // The step's work as the simulator's engine model counts it
  // (sim::StepWork): decode rows and the KV they attend over, prefill
  // tokens, their causal query x key pairs, and the prompts they complete.
  int decodes = 0, prompts_done = 0;
  int64_t decode_context = 0;
  double pairs = 0;
  for (const PlannedChunk& c : plan.chunks) {
    if (c.tokens == 1 && c.logits) {
      ++decodes;
      decode_context += c.start + 1;
    } else {
      pairs += c.tokens * (c.start + (c.tokens + 1) / 2.0);
      prompts_done += c.logits;
    }
  }
  spdlog::warn(
      "model {}: slow step, {:.1f} ms ({} chunks, {} prefill tokens, {} loads): inbox and tasks "
      "{:.3f}, plan {:.3f}, KV loads {:.3f}, launch {:.3f}, wait {:.3f}, tokens and finishes "
      "{:.3f}; {:.3f} from begin to end (exports of {} chunks, {} KiB: buffers {:.1f}, copies "
      "{:.1f}, checksums {:.1f}, puts {:.1f}); work: {} decodes over {} KV tokens, {:.0f} "
      "prefill pairs, {} prompts done; launched at {} us, collected at {} us; preempted so far: "
      "{} for growth, {} shed; {:.3f} ms of the plan asking the other models for KV",
      options_.name, total_ms, plan.chunks.size(), plan.prefill_tokens, plan.loads.size(), ms(0),
      ms(1), ms(2), ms(3), ms(5), ms(4), Ms(absl::Now() - step.began), e.chunks, e.bytes >> 10,
      e.alloc_ms, e.copy_ms, e.seal_ms, e.put_ms, decodes, decode_context, pairs, prompts_done,
      absl::ToUnixMicros(step.launch_began), absl::ToUnixMicros(collected),
      planner_->preemptions() - planner_->shed_preemptions(), planner_->shed_preemptions(), ms(6));
}

absl::Status ModelEngine::Launch(StepInFlight* step) {
  const StepPlan& plan = step->plan;
  std::vector<SequenceChunk> chunks;
  chunks.reserve(plan.chunks.size());
  const absl::Time now = absl::Now();
  for (const PlannedChunk& p : plan.chunks) {
    if (p.seq->first_scheduled == absl::InfinitePast()) p.seq->first_scheduled = now;
    SequenceChunk c;
    c.kv = &p.seq->kv;
    c.start_pos = p.start;
    c.tokens = absl::MakeConstSpan(p.seq->tokens).subspan(p.start, p.tokens);
    c.logits = p.logits ? LogitsMode::kLast : LogitsMode::kNone;
    c.from_row = p.from_row;
    chunks.push_back(c);
  }
  if (executor_->samples_on_device()) {
    std::vector<DeviceSampling> sampling;
    bool want_logprobs = false;
    for (const PlannedChunk& p : plan.chunks) {
      if (!p.logits) continue;
      const Sequence* s = p.seq;
      // The draw's counter: the outputs before this token (a pending one
      // counts: it is drawn first).
      sampling.push_back({s->req.params.sampling, s->seed, static_cast<uint64_t>(s->outputs()),
                          s->penalties.entries()});
      want_logprobs |= s->req.params.sampling.top_logprobs >= 0;
    }
    absl::Status st = executor_->StartForwardSample(chunks, sampling, want_logprobs);
    step->launched = st.ok();
    return st;
  }
  // Host sampling: the step runs in Collect, as a device's would run
  // between the two halves (its blocks stay in use until then).
  step->chunks = std::move(chunks);
  return absl::OkStatus();
}

absl::Status ModelEngine::Collect(StepInFlight* step) {
  if (executor_->samples_on_device()) {
    return executor_->FinishForwardSample(&step->sampled, &step->logprobs);
  }
  std::vector<float> logits;
  if (auto st = executor_->Forward(step->chunks, &logits); !st.ok()) return st;
  const int vocab = config_.vocab_size;
  size_t row = 0;
  for (const PlannedChunk& p : step->plan.chunks) {
    if (!p.logits) continue;
    Sequence* s = p.seq;
    const SamplingOptions& o = s->req.params.sampling;
    step->logprobs.emplace_back();
    step->sampled.push_back(SampleToken(logits.data() + row * vocab, vocab, o,
                                        s->penalties.entries(), s->rng,
                                        o.top_logprobs >= 0 ? &step->logprobs.back() : nullptr));
    ++row;
  }
  return absl::OkStatus();
}

void ModelEngine::AfterToken(Sequence* s, int64_t step_id, size_t index, int id,
                             const TokenLogprobs* logprobs) {
  const absl::Time now = absl::Now();
  if (s->first_token == absl::InfinitePast()) s->first_token = now;
  s->last_token = now;
  s->tokens[index] = id;
  if (s->pending_step == step_id) {
    s->pending_step = -1;
    s->pending_row = -1;
  }
  // Its length with this token (an ahead step's pending one may follow).
  const int len = static_cast<int>(index) + 1;
  if (s->req.params.sampling.has_penalties()) s->penalties.AddOutput(id);
  ++tokens_generated_;
  bool done = false;
  std::string text;
  if (tokenizer_->IsEos(id) && !s->req.params.ignore_eos) {  // any of the model's EOS ids
    s->result.reason = FinishReason::kEos;
    text = s->out->Finish();
    done = true;
  } else {
    bool stopped = false;
    text = s->out->Add(id, &stopped);
    if (stopped) {
      s->result.reason = FinishReason::kStop;
      done = true;
    } else if (len - s->prompt_len >= s->req.params.max_tokens) {
      s->result.reason = FinishReason::kLength;
      done = true;
    } else if (len >= context_window_) {
      s->result.reason = FinishReason::kContext;
      done = true;
    }
    if (done && !stopped) text += s->out->Finish();
  }
  s->sink->OnToken(id, text, logprobs);
  s->done = done;
  if (done && s->tokens.size() > static_cast<size_t>(len)) {
    // An ahead step's pending token after it is dropped.
    s->tokens.resize(static_cast<size_t>(len));
    s->pending_step = -1;
    s->pending_row = -1;
  }
}

void ModelEngine::Finish(std::unique_ptr<Sequence> s) {
  GenerationResult& r = s->result;
  r.output_tokens.assign(s->tokens.begin() + s->prompt_len, s->tokens.end());
  r.text = s->out->released();
  const absl::Time now = absl::Now();
  r.queue_ms = Ms(s->first_scheduled - s->req.arrival);
  r.ttft_ms = Ms(s->first_token - s->req.arrival);
  r.e2e_ms = Ms(now - s->req.arrival);
  const int n = static_cast<int>(r.output_tokens.size());
  r.mean_tpot_ms = n > 1 ? Ms(s->last_token - s->first_token) / (n - 1) : 0.0;
  // An ahead step may have fed the last token too; what is kept is the
  // same as without one.
  s->num_computed = std::min(s->num_computed, static_cast<int>(s->tokens.size()) - 1);
  kv_->Truncate(&s->kv, s->num_computed);  // a block it reserved for that token
  if (!s->req.session_id.empty()) {
    const bool exported = ExportSession(*s);
    // Keep the KV of every token but the last generated one (never fed).
    kv_manager_->Keep(s->req.session_id, std::move(s->kv),
                      std::vector<int>(s->tokens.begin(), s->tokens.begin() + s->num_computed),
                      s->req.priority, absl::InfiniteFuture(), exported);
  } else {
    kv_manager_->Free(&s->kv);
  }
  --active_;
  s->sink->OnDone(std::move(r));
}

void ModelEngine::Fail(std::unique_ptr<Sequence> s, const absl::Status& status) {
  kv_manager_->Free(&s->kv);
  --active_;
  s->sink->OnDone(status);
}

void ModelEngine::FailAll(const absl::Status& why, bool close) {
  FinishAllSteps();  // the steps in flight end first (their blocks are in use)
  // OnDone must get an error: an OK `why` would read as a result.
  const absl::Status status =
      why.ok() ? absl::UnavailableError(absl::StrCat("model ", options_.name, " closed")) : why;
  std::vector<std::function<void()>> tasks;
  {
    absl::MutexLock lock(&mu_);
    if (close) {
      closed_ = true;
      closed_why_ = status;
    }
    for (auto& s : inbox_) planner_->Enqueue(std::move(s));
    inbox_.clear();
    tasks.swap(tasks_);
  }
  for (auto& t : tasks) t();  // imports still answer their callers
  RetireReady();              // no step in flight: every one retired goes
  for (auto& s : planner_->TakeAll()) Fail(std::move(s), status);
}

void ModelEngine::AbortAll(const absl::Status& why) { FailAll(why, /*close=*/false); }

void ModelEngine::Close(const absl::Status& why) {
  FailAll(why, /*close=*/true);
  PublishStats();
}

}  // namespace ballast::engine
