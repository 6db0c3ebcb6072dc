// Seeded workload generators for `ballast trace` and trace statistics.
//
//  * Arrivals: Poisson or Gamma inter-arrivals per model (rate in requests/s,
//    Gamma with a coefficient of variation), as FineServe and Prism scale
//    their traces.
//  * Bursty: the production properties Prism §3 measured — a few persistent
//    models with always-on Gamma traffic (CV > 1) and many sporadic ones that
//    burst in shifting groups (a burst picks a random subset of them) — so
//    with the defaults 23–50% of models are active at once, the active set
//    changes a few hundred times per hour, and sporadic models show ~40–100
//    idle gaps per hour (checked by a test).
//  * Chat: multi-turn sessions (ShareGPT-like geometric turn counts,
//    lognormal prompt and reply lengths); each next turn follows the reply
//    after a reading delay (reply tokens / reading speed) plus a typing
//    delay; an advisory is released when typing starts (mean lead 11 s, as
//    Symphony §3 models it), missing with probability advise_miss; after a
//    session's last turn a spurious advisory appears with probability
//    advise_spurious.
//  * Agents: workflows walk an agent call graph (planner -> coder ->
//    reviewer/tester -> ...); when a step starts, advisories go to every
//    possible next-hop agent (spurious for the hops not taken).
//  * ShareGPT (offline throughput): N requests all released at t = 0 with
//    ShareGPT-like log-normal prompt and output lengths, filtered as the
//    vLLM and SGLang throughput benchmarks filter the dataset.
// All lengths are in tokens (bytes for the byte tokenizer) and scaled by
// length_scale so CPU runs stay short. Pure functions of their parameters.
#pragma once

#include <map>
#include <string>
#include <vector>

#include "bench/trace.h"

namespace ballast::bench {

struct LengthParams {
  double prompt_mean = 256, prompt_cv = 1.0;
  double output_mean = 128, output_cv = 0.8;
  double scale = 1.0;  // multiplies both means
  int prompt_max = 4096, output_max = 1024;
};

struct ArrivalParams {
  std::vector<std::string> models;
  std::vector<double> rates;        // requests/s per model (one value: all models)
  std::string process = "poisson";  // poisson | gamma
  double cv = 2.0;                  // gamma inter-arrival coefficient of variation
  double duration_s = 60;
  LengthParams lengths;
  uint64_t seed = 1;
};

struct BurstyParams {
  std::vector<std::string> models;
  double duration_s = 3600;
  double persistent_fraction = 0.2;  // share of always-on models (at least one)
  double persistent_rate = 1.0;      // requests/s of a persistent model
  double burst_rate = 2.0;           // requests/s of a sporadic model while ON
  double cv = 1.5;                   // Gamma CV of persistent models' inter-arrivals
  double burst_cv = 1.0;             // ... and of arrivals inside a burst
  // Bursty groups: every group_interval_s on average (Poisson) a burst of
  // mean length on_mean_s starts; each sporadic model joins it with
  // probability group_fraction (at least one joins).
  double group_interval_s = 25, group_fraction = 0.5, on_mean_s = 10;
  LengthParams lengths;
  uint64_t seed = 1;
};

struct ChatParams {
  std::vector<std::string> models;  // sessions pick a model, Zipf(1) by rank
  double session_rate = 0.2;        // new sessions/s
  double duration_s = 300;          // sessions start within this window
  double turns_mean = 3.5;
  int turns_max = 20;
  double reading_tokens_per_s = 20;
  double typing_mean_s = 11, typing_cv = 0.5;
  double advise_miss = 0.1, advise_spurious = 0.1;
  LengthParams lengths{64, 1.0, 160, 0.8, 1.0, 2048, 1024};
  uint64_t seed = 1;
};

struct AgentParams {
  std::vector<std::string> models;  // agents are mapped onto these in turn
  double workflow_rate = 0.1;       // workflows/s
  double duration_s = 300;
  double tool_mean_s = 1.0;  // delay between steps
  int max_steps = 12;
  LengthParams lengths{192, 0.8, 96, 0.8, 1.0, 2048, 1024};
  uint64_t seed = 1;
};

// Lengths: the means are the ShareGPT figures of the vLLM paper (Kwon et
// al., SOSP'23, Fig. 11a: 161.31 prompt and 337.99 output tokens). The paper
// gives histograms, not a spread: the CVs are our reading of their shapes
// (prompts near-exponential, outputs a broad hump with a long tail), so set
// them if you know better.
// A drawn pair is kept when prompt <= prompt_max, prompt + output <=
// total_max and both >= min_tokens (else drawn again), as the benchmarks
// filter the dataset; so the kept means are somewhat below the drawn ones
// (`ballast trace stats` prints them). Requests go to the models in turn.
struct ShareGptParams {
  std::vector<std::string> models;
  int requests = 1000;
  double prompt_mean = 161.31, prompt_cv = 1.0;
  double output_mean = 337.99, output_cv = 0.8;
  int prompt_max = 1024, total_max = 2048, min_tokens = 4;
  double scale = 1.0;  // multiplies both means and the limits (small for CPU runs)
  uint64_t seed = 1;
};

std::vector<TraceRecord> GenerateArrivals(const ArrivalParams& p);
std::vector<TraceRecord> GenerateBursty(const BurstyParams& p);
std::vector<TraceRecord> GenerateChat(const ChatParams& p);
std::vector<TraceRecord> GenerateAgents(const AgentParams& p);
// INVALID_ARGUMENT, naming the flag, for parameters no request fits.
absl::StatusOr<std::vector<TraceRecord>> GenerateShareGpt(const ShareGptParams& p);

// Properties of a trace's independent request arrivals (dependent records
// are placed at their nominal arrival_s). A model is active at t if it had
// an arrival in (t - window_s, t]; measured on a 1 s grid over [0, last
// arrival]. Every model named by a record or in `models` (the catalogue)
// counts, including idle ones (never active; one idle gap). Idle gaps include
// the time before a model's first arrival and after its last. Medians of an
// even count are the mean of the middle two.
struct TraceStats {
  int requests = 0, advisories = 0, sessions = 0, models = 0;
  double duration_s = 0;
  double mean_active_fraction = 0;         // Prism: 23-50%
  double active_set_changes_per_hour = 0;  // Prism: 54-766
  double median_interarrival_cv = 0;       // Prism: many models above 1
  double fraction_models_cv_above_1 = 0;
  double idle_gaps_per_hour = 0;  // gaps > 10 s, median model; Prism: 40-100
  // Requests' synthesised lengths (records with a text prompt count only
  // their output), mean and coefficient of variation.
  double prompt_tokens_mean = 0, prompt_tokens_cv = 0;
  double output_tokens_mean = 0, output_tokens_cv = 0;
  std::map<std::string, int> requests_per_model;
};
TraceStats ComputeStats(const std::vector<TraceRecord>& trace, double window_s = 5.0,
                        const std::vector<std::string>& models = {});
std::string FormatStats(const TraceStats& s);

}  // namespace ballast::bench
