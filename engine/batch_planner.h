// BatchPlanner: decides each step of one ModelEngine, as vLLM v1's
// scheduler does: which sequences run, how many tokens each computes, and
// which need logits. It owns the waiting and running sets and decides
// admission and preemption, asking the KvManager only narrow questions
// (Reserve, FitsWatermark, TakePrefix, Free). It never runs the model.
//
// Plan rule (one call of Plan()):
//   1. Running sequences, oldest first, each take min(remaining, budget)
//      tokens: a decode takes 1, an unfinished prefill the next chunk. If
//      blocks run out even after the KV manager dropped cached sessions,
//      the device's other models give back their idle KV and their running
//      sequences newer than this engine's newest (options.reclaim); then
//      this engine's newest running sequence is preempted (its blocks are
//      freed, it waits at the front and recomputes later from its tokens),
//      and so on; when that is the sequence being planned, the pass ends.
//      So the newest sequence on the device gives way first, and the oldest
//      always progresses.
//   2. Waiting sequences, in order (preempted ones first, and those
//      holding a session prefix they took at an attempt that did not
//      fit: see HoldsItsPlace), are admitted
//      while budget and max_seqs allow, the KV manager's admission
//      watermark passes and blocks can be reserved without preempting
//      anyone (other models' idle session KV is taken through
//      options.reclaim, once a pass); the first that does not fit ends the
//      pass (it waits).
//   3. A chunk asks for logits iff it computes the sequence's last token.
//   4. At its first admission attempt a sequence takes its session's device cache
//      (KvManager::TakePrefix); if its lease (engine/kv_tiers.h) covers
//      more of the prompt, the plan loads the lease's chunks into its
//      blocks (PlannedLoad) and it computes only the rest. A preempted
//      sequence recomputes everything.
// Shedding for the device preempts a named running sequence the same way.
//
// Ahead plans (Plan(true)) are made while the previous step is still in
// flight, so they never preempt or reclaim (the blocks in flight must
// stay): a running sequence whose blocks cannot grow, or whose pending
// token needs penalties, is left out; admission stops at a request with
// penalties or a lease. Either sets StepPlan::drain. A sequence
// whose pending token ends it (max_len) is left out: it will be done.
//
// Thread-safety: thread-compatible; the engine's step thread owns it.
#pragma once

#include <cstdint>
#include <deque>
#include <functional>
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "engine/kv_manager.h"
#include "engine/sequence.h"

namespace ballast::engine {

struct BatchPlannerOptions {
  int max_batch_tokens = 256;  // tokens per step (decodes + prefill chunks)
  int max_seqs = 64;           // most sequences running at once
  // ModelEngineOptions::reclaim_kv (null: none).
  std::function<int64_t(int64_t bytes, uint64_t newer_than)> reclaim;
};

// One sequence's share of a step: tokens [start, start + tokens).
struct PlannedChunk {
  Sequence* seq = nullptr;
  int start = 0;
  int tokens = 0;
  bool logits = false;  // the chunk ends the sequence's tokens: sample one
  // Its one token is the in-flight step's row `from_row` (seq->pending_row);
  // -1: its tokens are known.
  int from_row = -1;
};

// KV to copy from a lease into a newly admitted sequence's blocks before
// the step runs (engine/kv_tiers.h): chunks ending after `from_token`.
struct PlannedLoad {
  Sequence* seq = nullptr;
  std::shared_ptr<const KvPrefixLease> lease;
  int from_token = 0;  // layers below resident_layers: from here on
  int resident_layers = std::numeric_limits<int>::max();  // later layers: from token 0
};

struct StepPlan {
  std::vector<PlannedChunk> chunks;  // running sequences first, then admissions
  std::vector<PlannedLoad> loads;    // run before the chunks
  // Tokens of prefill work: everything but single decode tokens (prompt
  // chunks, and preempted sequences recomputing their KV).
  int prefill_tokens = 0;
  // An ahead plan left out work a plan with no step in flight would have
  // done (see the rule above): the next plan should wait for the steps in
  // flight.
  bool drain = false;
  bool empty() const { return chunks.empty(); }
};

// Whether a waiting sequence keeps its place at the front of the queue,
// whatever the arbitration's order: it was preempted (it recomputes, first),
// or it holds KV blocks (the session prefix taken at an admission attempt
// that did not fit). Arbitration leaves such sequences out (the engine's
// Queued() reports them as `preempted`).
bool HoldsItsPlace(const Sequence& s);

class BatchPlanner {
 public:
  // `kv` must outlive the planner.
  BatchPlanner(const BatchPlannerOptions& options, KvManager* kv);
  // Frees the blocks of sequences still held.
  ~BatchPlanner();
  BatchPlanner(const BatchPlanner&) = delete;
  BatchPlanner& operator=(const BatchPlanner&) = delete;

  // Plans the next step (reserving its blocks). Empty: nothing can run now.
  // `ahead`: the previous step is still in flight (the rule above).
  StepPlan Plan(bool ahead = false);

  // Adds a new sequence at the back of the waiting queue.
  void Enqueue(std::unique_ptr<Sequence> seq);
  bool empty() const { return waiting_.empty() && running_.empty(); }
  const std::deque<std::unique_ptr<Sequence>>& waiting() const { return waiting_; }
  const std::vector<std::unique_ptr<Sequence>>& running() const { return running_; }
  // Sequences preempted so far: all of them, and those of them by Preempt
  // (the device's shedding; the rest found no block to grow into).
  int64_t preemptions() const { return preemptions_; }
  int64_t shed_preemptions() const { return shed_preemptions_; }

  // Removes the sequences whose request id is in `ids`, waiting ones first,
  // then running ones, each in order. Their blocks stay with them.
  std::vector<std::unique_ptr<Sequence>> Remove(const absl::flat_hash_set<std::string>& ids);
  // Removes one waiting sequence (null if not waiting).
  std::unique_ptr<Sequence> RemoveWaiting(const std::string& id);
  // Removes the running sequences marked done, in running order.
  std::vector<std::unique_ptr<Sequence>> TakeDone();
  // Removes everything: running (newest first), then waiting (in order).
  std::vector<std::unique_ptr<Sequence>> TakeAll();
  // Admission order: ascending rank; sequences holding their place
  // (HoldsItsPlace) stay first, sequences without a rank go last (stable:
  // arrival order among equals).
  void SetAdmissionOrder(const absl::flat_hash_map<std::string, int>& rank);

  // Device shedding: preempts the running sequence of `request_id`; returns
  // the bytes freed (0 if it is not running).
  int64_t Preempt(const std::string& request_id);
  // One kRunning holding per running sequence (with_slabs: as
  // KvManager::Holdings).
  std::vector<KvHolding> Holdings(bool with_slabs = false) const;
  // Adds the block table of every sequence it holds, running and waiting
  // (KV relocation rewrites them).
  void AppendTables(std::vector<SequenceKv*>* out);

 private:
  // Reserves blocks for `seq` up to `tokens` positions, preempting the
  // newest running sequences while blocks are short. False if `seq` itself
  // was preempted or nothing is left to preempt.
  bool ReserveOrPreempt(Sequence* seq, int tokens);
  // First admission of `seq`: attach its session's kept KV prefix.
  void AttachSessionPrefix(Sequence* seq);
  // Frees running_[i]'s blocks and moves it to the front of waiting_.
  void PreemptAt(size_t i);
  void PlanRunning(StepPlan* plan, int* budget, bool ahead);
  void PlanAdmissions(StepPlan* plan, int* budget, bool ahead);
  // The running sequences' next growth, for the other models' admission
  // watermark on a shared pool (KvManager::SetGrowthReserve).
  void PublishGrowth();

  const BatchPlannerOptions options_;
  KvManager* const kv_;
  std::deque<std::unique_ptr<Sequence>> waiting_;
  std::vector<std::unique_ptr<Sequence>> running_;  // admission order
  int64_t preemptions_ = 0;
  int64_t shed_preemptions_ = 0;
};

}  // namespace ballast::engine
