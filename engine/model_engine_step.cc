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
  if (!BeginStep()) return false;
  FinishStep();
  return true;
}

bool ModelEngine::BeginStep(StepUrgency urgency) {
  last_prefill_tokens_ = 0;  // also when this step does nothing
  step_ = StepInFlight{};
  absl::Time at[5];
  at[0] = absl::Now();
  step_.began = at[0];
  DrainInbox();
  at[1] = absl::Now();
  step_.plan = planner_->empty() ? StepPlan{} : planner_->Plan();
  if (step_.plan.empty()) {
    PublishStats();
    return false;
  }
  at[2] = absl::Now();
  last_prefill_tokens_ = step_.plan.prefill_tokens;
  export_times_ = {};
  const bool urgent =
      urgency == StepUrgency::kUrgent ||
      (urgency == StepUrgency::kUrgentIfDecodeOnly && step_.plan.prefill_tokens == 0);
  if (urgent != urgent_) {  // no step in flight: the executor may switch streams
    if (absl::Status st = executor_->SetUrgent(urgent); st.ok()) {
      urgent_ = urgent;
    } else {
      spdlog::warn("model {}: stream priority not changed: {}", options_.name, st.ToString());
    }
  }
  urgent_steps_ += urgent_;
  step_.status = RunLoads(step_.plan);
  at[3] = absl::Now();
  if (step_.status.ok()) step_.status = Launch(step_.plan);
  at[4] = absl::Now();
  for (int p = 0; p < 4; ++p) step_.phase_ms[p] = Ms(at[p + 1] - at[p]);
  step_.active = true;
  return true;
}

void ModelEngine::NotifyWhenDeviceDone(std::function<void()> done) {
  if (step_.active && step_.status.ok() && executor_->samples_on_device()) {
    executor_->NotifyWhenStepDone(std::move(done));
  } else {
    done();
  }
}

void ModelEngine::FinishStep() {
  if (!step_.active) return;
  step_.active = false;
  const absl::Time t0 = absl::Now();
  if (step_.status.ok()) step_.status = Collect();
  const absl::Time t1 = absl::Now();
  step_.phase_ms[5] = Ms(t1 - t0);
  ++steps_;
  if (remapper_ && step_.status.ok()) {
    remapper_->ObserveForward((step_.phase_ms[3] + step_.phase_ms[5]) / 1e3,
                              step_.plan.prefill_tokens == 0);
  }
  const StepPlan& plan = step_.plan;
  if (!step_.status.ok()) {
    // A load the failed step did not finish must end before its blocks
    // are freed.
    if (!plan.loads.empty()) executor_->WaitKvLoad().IgnoreError();
    AbortAll(step_.status);
    PublishStats();
  } else {
    size_t row = 0;
    for (const PlannedChunk& c : plan.chunks) {
      c.seq->num_computed += c.tokens;
      if (c.logits) {
        const bool want =
            c.seq->req.params.sampling.top_logprobs >= 0 && row < step_.logprobs.size();
        AfterToken(c.seq, step_.sampled[row], want ? &step_.logprobs[row] : nullptr);
        ++row;
      }
    }
    for (auto& s : planner_->TakeDone()) Finish(std::move(s));
    PublishStats();
  }
  step_.phase_ms[4] = Ms(absl::Now() - t1);
  // Host time: everything but the forward (its launch and its wait).
  last_step_host_s_ =
      (step_.phase_ms[0] + step_.phase_ms[1] + step_.phase_ms[2] + step_.phase_ms[4]) / 1e3;
  double total_ms = 0;
  for (double ms : step_.phase_ms) total_ms += ms;
  if (options_.slow_step_warn_ms > 0 && total_ms >= options_.slow_step_warn_ms) {
    LogSlowStep(plan, total_ms);
  }
  step_.plan = {};
}

void ModelEngine::LogSlowStep(const StepPlan& plan, double total_ms) const {
  auto ms = [&](int i) { return step_.phase_ms[i]; };
  const ExportTimes& e = export_times_;
  spdlog::warn(
      "model {}: slow step, {:.1f} ms ({} chunks, {} prefill tokens, {} loads): inbox and tasks "
      "{:.3f}, plan {:.3f}, KV loads {:.3f}, launch {:.3f}, wait {:.3f}, tokens and finishes "
      "{:.3f}; {:.3f} from begin to end (exports of {} chunks, {} KiB: buffers {:.1f}, copies "
      "{:.1f}, checksums {:.1f}, puts {:.1f})",
      options_.name, total_ms, plan.chunks.size(), plan.prefill_tokens, plan.loads.size(), ms(0),
      ms(1), ms(2), ms(3), ms(5), ms(4), Ms(absl::Now() - step_.began), e.chunks, e.bytes >> 10,
      e.alloc_ms, e.copy_ms, e.seal_ms, e.put_ms);
}

absl::Status ModelEngine::Launch(const StepPlan& plan) {
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
    chunks.push_back(c);
  }
  if (executor_->samples_on_device()) {
    std::vector<DeviceSampling> sampling;
    bool want_logprobs = false;
    for (const PlannedChunk& p : plan.chunks) {
      if (!p.logits) continue;
      const Sequence* s = p.seq;
      sampling.push_back({s->req.params.sampling, s->seed, static_cast<uint64_t>(s->outputs()),
                          s->penalties.entries()});
      want_logprobs |= s->req.params.sampling.top_logprobs >= 0;
    }
    return executor_->StartForwardSample(chunks, sampling, want_logprobs);
  }
  // Host sampling: the step runs in Collect, as a device's would run
  // between the two halves (its blocks stay in use until then).
  step_.chunks = std::move(chunks);
  return absl::OkStatus();
}

absl::Status ModelEngine::Collect() {
  if (executor_->samples_on_device()) {
    return executor_->FinishForwardSample(&step_.sampled, &step_.logprobs);
  }
  std::vector<float> logits;
  if (auto st = executor_->Forward(step_.chunks, &logits); !st.ok()) return st;
  const int vocab = config_.vocab_size;
  size_t row = 0;
  for (const PlannedChunk& p : step_.plan.chunks) {
    if (!p.logits) continue;
    Sequence* s = p.seq;
    const SamplingOptions& o = s->req.params.sampling;
    step_.logprobs.emplace_back();
    step_.sampled.push_back(SampleToken(logits.data() + row * vocab, vocab, o,
                                        s->penalties.entries(), s->rng,
                                        o.top_logprobs >= 0 ? &step_.logprobs.back() : nullptr));
    ++row;
  }
  return absl::OkStatus();
}

void ModelEngine::AfterToken(Sequence* s, int id, const TokenLogprobs* logprobs) {
  const absl::Time now = absl::Now();
  if (s->first_token == absl::InfinitePast()) s->first_token = now;
  s->last_token = now;
  s->tokens.push_back(id);
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
    } else if (s->outputs() >= s->req.params.max_tokens) {
      s->result.reason = FinishReason::kLength;
      done = true;
    } else if (static_cast<int>(s->tokens.size()) >= context_window_) {
      s->result.reason = FinishReason::kContext;
      done = true;
    }
    if (done && !stopped) text += s->out->Finish();
  }
  s->sink->OnToken(id, text, logprobs);
  s->done = done;
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
  FinishStep();  // a step in flight ends first (its blocks are in use)
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
  for (auto& s : planner_->TakeAll()) Fail(std::move(s), status);
}

void ModelEngine::AbortAll(const absl::Status& why) { FailAll(why, /*close=*/false); }

void ModelEngine::Close(const absl::Status& why) {
  FailAll(why, /*close=*/true);
  PublishStats();
}

}  // namespace ballast::engine
