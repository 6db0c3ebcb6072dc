// The batch-invariance scenario of the deterministic mode's tests, for any
// backend: one target sequence runs alone (its prompt in one chunk, then
// decode steps), and again sharing every step with `others` sequences at
// other stages (their prompts of 4-200 tokens, the first one's twice the
// target's, so the step's context and attention partitions outgrow the
// target's, prefilled in chunks that fit the step's token budget, then
// decodes), with its own prompt cut into
// other chunks and its row at a varying place in the batch. Decode inputs
// are fixed token ids, not sampled, so every run feeds the same tokens.
// TargetLogits returns the logits of the target's last prompt position and
// of each decode step ([1 + decode_steps][vocab]).
#pragma once

#include <algorithm>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "engine/executor.h"
#include "engine/kv_cache.h"
#include "gtest/gtest.h"

namespace ballast::engine::testing {

struct InvarianceScenario {
  int vocab = 0;
  int prompt = 300;       // the target's prompt tokens
  int decode_steps = 12;  // then this many decode steps
  int chunk = 0;          // the target's prefill chunk (0: the whole prompt)
  int budget = 512;       // tokens per step, the target's first
  int others = 0;         // sequences sharing the steps
  uint32_t seed = 1;      // the others' lengths, tokens and the target's place
};

inline std::vector<float> TargetLogits(Executor* ex, KvCache* kv, const InvarianceScenario& s) {
  struct Seq {
    SequenceKv kv;
    std::vector<int> tokens;
    int prompt = 0, done = 0, start_step = 0;
  };
  std::mt19937 rng(s.seed);
  std::vector<Seq> seqs(1 + static_cast<size_t>(s.others));
  Seq& target = seqs[0];
  target.prompt = s.prompt;
  for (int i = 0; i < s.prompt + s.decode_steps; ++i)
    target.tokens.push_back((i * 37 + 11) % s.vocab);
  for (size_t i = 1; i < seqs.size(); ++i) {
    seqs[i].prompt = i == 1 ? 2 * s.prompt : 4 + static_cast<int>(rng() % 197);
    seqs[i].start_step = static_cast<int>(rng() % 4);  // some join later
    const int len = seqs[i].prompt + s.decode_steps + 64;
    for (int j = 0; j < len; ++j) seqs[i].tokens.push_back(static_cast<int>(rng() % s.vocab));
  }
  for (Seq& q : seqs) {
    const absl::Status st = kv->Reserve(&q.kv, static_cast<int>(q.tokens.size()));
    EXPECT_TRUE(st.ok()) << st;
  }
  std::vector<float> out;
  const int total = s.prompt + s.decode_steps;
  for (int step = 0; target.done < total; ++step) {
    // The target's piece first (it must make progress), then the others'.
    std::vector<std::pair<Seq*, int>> pieces;
    const int left = target.prompt - target.done;
    const int target_n = left > 0 ? std::min({s.chunk > 0 ? s.chunk : left, left, s.budget}) : 1;
    int budget = s.budget - target_n;
    for (size_t i = 1; i < seqs.size() && budget > 0; ++i) {
      Seq& q = seqs[i];
      if (step < q.start_step || q.done >= static_cast<int>(q.tokens.size())) continue;
      const int n = q.done < q.prompt ? std::min(q.prompt - q.done, budget) : 1;
      pieces.push_back({&q, n});
      budget -= n;
    }
    const size_t at = rng() % (pieces.size() + 1);
    pieces.insert(pieces.begin() + static_cast<std::ptrdiff_t>(at), {&target, target_n});
    std::vector<SequenceChunk> batch;
    for (const auto& [q, n] : pieces) {
      batch.push_back(
          {&q->kv, q->done, absl::MakeConstSpan(q->tokens).subspan(q->done, n), LogitsMode::kLast});
    }
    std::vector<float> logits;
    const absl::Status st = ex->Forward(batch, &logits);
    EXPECT_TRUE(st.ok()) << st;
    if (!st.ok()) break;
    // One row per chunk (all kLast): the target's is row `at`. Its rows
    // before the prompt's end are not compared (alone, there are none).
    if (target.done + target_n >= target.prompt) {
      const auto row = logits.begin() + static_cast<std::ptrdiff_t>(at * s.vocab);
      out.insert(out.end(), row, row + s.vocab);
    }
    for (const auto& [q, n] : pieces) q->done += n;
  }
  for (Seq& q : seqs) kv->Release(&q.kv);
  return out;
}

// "" when a and b are equal bit for bit, else where they first differ.
inline std::string FirstDifference(const std::vector<float>& a, const std::vector<float>& b,
                                   int vocab) {
  if (a.size() != b.size()) return absl::StrCat("sizes ", a.size(), " and ", b.size());
  size_t differ = 0, first = a.size();
  double max_abs = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    if (std::memcmp(&a[i], &b[i], sizeof(float)) == 0) continue;
    ++differ;
    first = std::min(first, i);
    max_abs = std::max(max_abs, static_cast<double>(std::abs(a[i] - b[i])));
  }
  if (differ == 0) return "";
  return absl::StrCat(differ, " of ", a.size(), " logits differ, first at step ",
                      first / static_cast<size_t>(vocab), " token ",
                      first % static_cast<size_t>(vocab), " (", a[first], " vs ", b[first],
                      "), max abs difference ", max_abs);
}

}  // namespace ballast::engine::testing
