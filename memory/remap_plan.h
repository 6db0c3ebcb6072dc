// Parameter remapping's decisions (Mirage §5.2-5.5), as pure functions so
// they are unit-tested without engines: which layers a model streams, how
// many slots they share, how many layers the measured timings allow, and
// which models give layers first (and take them back last).
//
// Terms (Mirage §5.4). A model has n decoder layers. Remapping lends the
// memory of α layers to KV. Then m = α + β layers are streamed from the
// host copy each step, sharing β device slots (β = 1, or 2 for double
// buffering); the other n - m layers stay resident. The m streamed layers
// are the first m of one fixed order of the layers (StreamedLayers), so
// the set for m + 1 holds the set for m: lending one more layer copies
// nothing, and taking one back copies just that layer. (Mirage spaces the
// m layers evenly; then a change of m moves most of them, and each layer
// that stops being lent is copied back from the host before the next
// step: about 8 ms for a Llama-3-8B layer on an H200, so 25-67 ms per
// lend and more per revert in issue 20's runs.) Streamed layer k
// (0-based, in layer order) always uses slot k % β, and slot s's memory is
// the home of streamed layer s, so the pages of streamed layers β..m-1
// (exactly α layers) are the ones lent to KV.
//
// Thread-safety: pure functions.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

namespace ballast::memory {

// Which layers a model streams, and through how many slots. alpha == 0:
// no remapping (streamed empty, slots 0).
struct StreamingPlan {
  int alpha = 0;
  int slots = 0;              // β
  std::vector<int> streamed;  // m = alpha + slots layer indices, ascending
  // Layers whose pages are lent to KV: streamed[slots..m-1].
  std::vector<int> Lent() const;
  bool operator==(const StreamingPlan&) const = default;
};

// Every layer of n once, in the order remapping streams them: layer 0,
// then repeatedly the middle of the widest gap between layers taken
// (counting n, the next pass's layer 0, as taken; ties in van der Corput
// order, so each round of halvings spreads over the pass). n = 32: 0, 16,
// 8, 24, 4, 20, 12, 28, 2, 18, ... Empty for n <= 0.
std::vector<int> LendOrder(int n);

// The m layers of n a plan streams: the first m of LendOrder(n),
// ascending. Nested (StreamedLayers(n, m) is part of StreamedLayers(n,
// m + 1)) and spread: the widest gap between neighbours (the last one's to
// n included) is at most twice the narrowest plus one, and evenly spaced
// where m is a power of two dividing n (Mirage's example: n = 8, m = 2
// gives layers 0 and 4). Empty unless 0 < m <= n.
std::vector<int> StreamedLayers(int n, int m);

// β for α remapped layers of an n-layer model whose one-layer transfer
// takes t_transfer and one-layer compute t_compute (seconds):
//   1 while T_T·(α+1) <= T_c·(n-α-1)  (one slot: a layer's copy cannot
//     start before the slot's last reader is done, Mirage eq. 4);
//   2 while T_T·(α+2) <= T_c·n        (double buffered, eq. 5);
//   0 when neither holds (the transfers would stall compute) or α+β > n.
// Each equation is checked together with the pass it averages, run as the
// executors run it: every copy, queued on one copy engine, must be in its
// slot before its layer computes, and the slots' reloads of their home
// layers must end within the pass (steps join their copies). The
// equations miss uneven gaps (with n = 40, m = 25, T_T = T_c/2 eq. 4
// holds but gaps of one layer leave no time at all) and copies queued
// behind each other.
// alpha == 0 gives 0 (nothing to stream).
int SlotsFor(int n, int alpha, double t_transfer, double t_compute);

// The largest α in [0, cap] with SlotsFor(n, α, ...) > 0 (0 if none).
int MaxAlpha(int n, double t_transfer, double t_compute, int cap);

// The plan for α layers: β = SlotsFor, streamed = StreamedLayers(n, α+β).
// alpha == 0 or SlotsFor == 0: the empty plan.
StreamingPlan PlanStreaming(int n, int alpha, double t_transfer, double t_compute);

// Layer copies one step of `plan` makes: the α lent layers into the slots,
// and the slots' home layers back (a slot whose home is its only layer is
// not reloaded): α + min(α, β). 0 without remapping.
int CopiesPerStep(const StreamingPlan& plan);

// The host-to-device link is one per device, and every streaming model's
// copies share it. A model whose steps copy CopiesPerStep(plan) layers of
// T_T each, and take n x T_c of compute, keeps the link busy this share of
// the time (above 1 its copies cannot keep up even alone). Unknown T_c
// (<= 0): 0, as the caps take an unknown T_c for no constraint.
double LinkShare(int n, const StreamingPlan& plan, double t_transfer, double t_compute);

// One layer's copy as a model sees it when the other streaming models hold
// `others` of the link (their LinkShare summed): the link's rest, shared
// fluidly, so T_T / (1 - others). Returns a negative value when the others
// leave nothing (others >= 1): no α > 0 hides then.
double SharedTransfer(double t_transfer, double others);

// Streaming checked against the card. T_c is measured beside the device's
// other models' steps (a busy model's layers take longer by what shares
// the GPU with them), and a copy hides only where the model's own layers
// then really take that long: on an H200 a busy 8B model that lent 3
// layers at a measured T_c of 1.47 ms stalled about 16 ms of each 35-45
// ms step for 30 s (docs/benchmarks.md, session 49). So each streaming
// step's measured stall corrects T_c. Over each window of kWindow
// streaming steps:
//   - a mean stall share (stall / step time) above kHigh multiplies the
//     correction by (1 - share), at least kMin: the cap falls and the
//     model, now over its cap, takes layers back at once;
//   - a mean below kLow lets it recover by kRecover, back to 1.
// Thread-safety: a value; one owner.
struct StallCorrection {
  static constexpr int kWindow = 8;
  static constexpr double kHigh = 0.1;
  static constexpr double kLow = 0.02;
  static constexpr double kRecover = 1.25;
  static constexpr double kMin = 0.05;
  double factor = 1;  // what T_c is multiplied by
  double shares = 0;  // the window's stall shares so far
  int steps = 0;      // streaming steps in the window so far
  // One streaming step's stall share (clamped to [0, 1]). Returns whether
  // `factor` changed.
  bool Observe(double stall_share);
  // A new streaming plan: the window starts again (the factor stays).
  void Restart() { shares = 0, steps = 0; }
};

// A resident model as the remap controller sees it.
struct RemapCandidate {
  int owner = 0;            // the caller's index
  bool active = false;      // has running or waiting requests
  int priority = 0;         // lower gives layers first
  int64_t last_active = 0;  // larger = more recently active (MRU goes first)
  int alpha = 0;            // layers remapped now
  int alpha_cap = 0;        // most layers it may lend (timing and floor)
  int64_t layer_bytes = 0;  // bytes one more lent layer frees
};

// Donor order (Mirage §5.2): inactive models first, then active ones; in
// each group lowest priority first, then most recently active first (MRU
// defers the transfer cost to the model least likely to run next), then
// lower owner. Indices into `models`.
std::vector<size_t> DonorOrder(const std::vector<RemapCandidate>& models);

// New α per model (same order as `models`) so that the added layers'
// bytes cover `shortfall_bytes`: layers are taken one at a time from the
// first donor (DonorOrder) until its cap, then the next. Where every cap
// is reached first, it takes all it can (the caller falls back to the
// next rung). shortfall <= 0: unchanged.
std::vector<int> PlanRemap(const std::vector<RemapCandidate>& models, int64_t shortfall_bytes);

// Reversion (Mirage §5.5): the model that takes one layer back first, in
// the reverse of donor order (the active model's layers come back first,
// the inactive lowest-priority model's last). -1 when none has α > 0.
int RevertNext(const std::vector<RemapCandidate>& models);

// Bytes the models could still lend now: every model's layers up to its
// cap (an idle model's floor, a busy one's timed cap) that it does not
// lend yet, at `layer_bytes` each as PlanRemap counts them (a layer lends
// its whole pages only: up to a page less each). KV room as real as free
// memory for a model short of it (its admission asks, and the lend
// answers within a step), so the scheduler counts it before evicting an
// idle model for KV (v1::DeviceState::kv_bytes_lendable).
int64_t LendableBytes(const std::vector<RemapCandidate>& models);

}  // namespace ballast::memory
