#include "engine/weight_remapper.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "absl/strings/str_cat.h"

namespace ballast::engine {

std::unique_ptr<WeightRemapper> WeightRemapper::Create(Executor* executor,
                                                       std::shared_ptr<memory::WeightPages> pages) {
  if (executor == nullptr || pages == nullptr) return nullptr;
  std::vector<LayerExtent> extents = executor->LayerExtents();
  if (extents.size() < 2) return nullptr;
  // A layer smaller than two pages may free none: nothing to gain.
  int64_t least = -1;
  for (const LayerExtent& e : extents) {
    const int64_t b = pages->LendableBytes(e.offset, e.bytes);
    least = least < 0 ? b : std::min(least, b);
  }
  if (least <= 0) return nullptr;
  auto r = std::unique_ptr<WeightRemapper>(
      new WeightRemapper(executor, std::move(pages), std::move(extents)));
  r->layer_bytes_ = least;
  return r;
}

WeightRemapper::WeightRemapper(Executor* executor, std::shared_ptr<memory::WeightPages> pages,
                               std::vector<LayerExtent> extents)
    : executor_(executor), pages_(std::move(pages)), extents_(std::move(extents)) {}

int WeightRemapper::AlphaCap(double max_fraction, bool respect_timing) const {
  const int n = num_layers();
  const int floor_cap = std::clamp(static_cast<int>(std::floor(max_fraction * n)), 0, n - 2);
  if (!respect_timing || t_compute() <= 0 || t_transfer_ <= 0) return floor_cap;
  const double t_transfer = memory::SharedTransfer(t_transfer_, link_others_);
  if (t_transfer < 0) return 0;  // the other streaming models fill the link
  return memory::MaxAlpha(n, t_transfer, t_compute(), floor_cap);
}

absl::Status WeightRemapper::Prepare() {
  if (t_transfer_ > 0) return absl::OkStatus();
  auto t = executor_->MeasureLayerTransferSeconds();
  if (!t.ok()) return t.status();
  t_transfer_ = std::max(*t, 1e-9);
  return absl::OkStatus();
}

absl::StatusOr<int64_t> WeightRemapper::SetAlpha(int alpha, int slots) {
  const int n = num_layers();
  if (alpha == plan_.alpha && (slots == 0 || alpha == 0 || slots == plan_.slots)) return 0;
  if (alpha < 0 || alpha >= n || slots < 0 || slots > 2 || (alpha > 0 && alpha + slots > n)) {
    return absl::InvalidArgumentError(
        absl::StrCat("cannot lend ", alpha, " of ", n, " layers through ", slots, " slot(s)"));
  }
  auto next = PlanFor(alpha, slots);
  if (!next.ok()) return next.status();
  const std::vector<int> was = plan_.Lent(), now = next->Lent();
  std::vector<int> lend, restore;
  std::set_difference(now.begin(), now.end(), was.begin(), was.end(), std::back_inserter(lend));
  std::set_difference(was.begin(), was.end(), now.begin(), now.end(), std::back_inserter(restore));
  if (broken_) {
    return absl::FailedPreconditionError(
        "an earlier remapping lost weight layers after a device fault; reload the model");
  }
  auto net = SwapLayers(lend, restore, *next);
  if (!net.ok()) return net.status();
  if (alpha != plan_.alpha) (alpha > plan_.alpha ? remaps_ : reverts_)++;
  plan_ = *std::move(next);
  stall_fix_.Restart();  // the window judges one plan
  return *net;
}

absl::StatusOr<memory::StreamingPlan> WeightRemapper::PlanFor(int alpha, int slots) {
  const int n = num_layers();
  memory::StreamingPlan next;
  if (alpha > 0) {
    if (auto st = Prepare(); !st.ok()) return st;
    // Unknown T_c (no step yet): plan as if compute hid any copy.
    const double tc = t_compute() > 0 ? t_compute() : std::numeric_limits<double>::max() / 4 / n;
    if (slots > 0) {
      next.alpha = alpha;
      next.slots = slots;
      next.streamed = memory::StreamedLayers(n, alpha + slots);
    } else {
      // With the link the other streaming models leave; none: no plan.
      const double tt = memory::SharedTransfer(t_transfer_, link_others_);
      if (tt > 0) next = memory::PlanStreaming(n, alpha, tt, tc);
      if (next.alpha == 0 && !respect_timing_) {  // stream anyway, double buffered
        next.alpha = alpha;
        next.slots = 2;
        next.streamed = memory::StreamedLayers(n, alpha + 2);
      }
    }
    if (next.alpha == 0) {
      return absl::FailedPreconditionError(absl::StrCat(
          "lending ", alpha, " of ", n, " layers would stall compute (T_T ", t_transfer_ * 1e3,
          " ms, T_c ", t_compute() * 1e3, " ms per layer; other models' copies hold ",
          link_others_ * 100, "% of the link)"));
    }
  }
  return next;
}

std::vector<memory::WeightPages::Extent> WeightRemapper::ExtentsOf(
    const std::vector<int>& layers) const {
  std::vector<memory::WeightPages::Extent> out;
  for (int l : layers) {
    const LayerExtent& e = extents_[static_cast<size_t>(l)];
    out.push_back({e.offset, e.bytes});
  }
  return out;
}

absl::StatusOr<int64_t> WeightRemapper::SwapLayers(const std::vector<int>& lend,
                                                   const std::vector<int>& restore,
                                                   const memory::StreamingPlan& next) {
  const auto lend_x = ExtentsOf(lend), restore_x = ExtentsOf(restore);
  // One step on the device's pool: what the lends free covers the restores
  // (one fewer layer), and no other model's KV or activation can take it in
  // between. (Lending, then restoring, left that window open: a failure
  // then found the lent pages taken and could not undo.)
  auto net = pages_->Exchange(lend_x, restore_x);
  if (!net.ok()) {
    // Out of room: nothing changed. A driver failure mapped the lent
    // layers' pages again but lost their bytes: copy them back from the
    // host image (DATA_LOSS: not even the pages came back).
    if (absl::IsDataLoss(net.status()) ||
        (absl::IsInternal(net.status()) && !executor_->RestoreLayers(lend).ok())) {
      broken_ = true;
    }
    return net.status();
  }
  // Prepare made the host image and every plan here is well formed, so
  // only a device fault fails these.
  absl::Status st = executor_->RestoreLayers(restore);
  if (st.ok()) st = executor_->SetLayerStreaming(next);
  if (!st.ok()) {
    // Back to the old plan's pages, in one step again, and its streaming.
    if (!pages_->Exchange(restore_x, lend_x).ok()) {
      broken_ = true;
      return absl::InternalError(
          absl::StrCat("remapping failed (", st.message(),
                       ") and the lent layers' pages were taken meanwhile; reload the model"));
    }
    executor_->RestoreLayers(lend).IgnoreError();
    executor_->SetLayerStreaming(plan_).IgnoreError();
    return st;
  }
  return net;
}

void WeightRemapper::SetActivationDecode(double seconds) {
  if (seconds > 0) t_compute_activation_ = seconds / num_layers();
}

void WeightRemapper::ObserveForward(double seconds, bool decode_only) {
  const double stall = executor_->streaming_stats().stall_seconds;
  const double delta = stall - last_stall_;
  last_stall_ = stall;
  ObserveStep(seconds, delta, decode_only);
}

void WeightRemapper::ObserveStep(double seconds, double stall, bool decode_only) {
  // Steps that streamed layers do not sample T_c: their compute is their
  // time less the timed stall, and any wait the timing misses (host work
  // blocked behind a copy) would count as compute and justify itself.
  // Their stall checks the plan instead. (The executor harvests a step's
  // stall when the next one launches, so the share is one step late.)
  if (plan_.alpha > 0) {
    if (seconds > 0) stall_fix_.Observe(std::max(0.0, stall) / seconds);
    return;
  }
  if (!decode_only) return;
  const double per_layer = std::max(0.0, seconds - std::max(0.0, stall)) / num_layers();
  if (per_layer <= 0) return;
  // The smallest of the last kWindow decode steps: a step that also
  // captured a CUDA graph or waited on the host is not compute that hides
  // copies, and one such step must not let α grow.
  recent_[recent_next_] = per_layer;
  recent_next_ = (recent_next_ + 1) % kWindow;
  double best = 0;
  for (double t : recent_) {
    if (t > 0) best = best > 0 ? std::min(best, t) : t;
  }
  t_compute_ = best;
}

}  // namespace ballast::engine
