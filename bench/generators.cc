#include "bench/generators.h"

#include <algorithm>
#include <cmath>
#include <random>
#include <set>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace ballast::bench {
namespace {

// Seeded sampling built only on mt19937_64 (fixed by the standard), so a
// seed gives the same trace on every platform.
class Rng {
 public:
  explicit Rng(uint64_t seed) : g_(seed) {}
  double Uniform() { return (static_cast<double>(g_() >> 11) + 0.5) * 0x1.0p-53; }
  double Exp(double rate) { return -std::log(Uniform()) / rate; }
  double Normal() {
    return std::sqrt(-2.0 * std::log(Uniform())) * std::cos(2.0 * M_PI * Uniform());
  }
  // Marsaglia-Tsang; shape < 1 via the U^(1/shape) boost.
  double Gamma(double shape, double scale) {
    if (shape < 1.0) return Gamma(shape + 1.0, scale) * std::pow(Uniform(), 1.0 / shape);
    const double d = shape - 1.0 / 3.0, c = 1.0 / std::sqrt(9.0 * d);
    while (true) {
      double x, v;
      do {
        x = Normal();
        v = 1.0 + c * x;
      } while (v <= 0);
      v = v * v * v;
      const double u = Uniform();
      if (std::log(u) < 0.5 * x * x + d - d * v + d * std::log(v)) return d * v * scale;
    }
  }
  // Inter-arrival gap for `rate` with coefficient of variation `cv`.
  double Gap(double rate, const std::string& process, double cv) {
    if (process == "poisson" || cv <= 0) return Exp(rate);
    const double k = 1.0 / (cv * cv);
    return Gamma(k, 1.0 / (rate * k));
  }
  double LogNormal(double mean, double cv) {
    const double s2 = std::log(1.0 + cv * cv);
    return std::exp(std::log(mean) - s2 / 2 + std::sqrt(s2) * Normal());
  }
  bool Bernoulli(double p) { return Uniform() < p; }
  // 1 + Geometric with the given mean (>= 1).
  int Turns(double mean, int max) {
    int n = 1;
    const double p_more = 1.0 - 1.0 / std::max(1.0, mean);
    while (n < max && Bernoulli(p_more)) ++n;
    return n;
  }
  // Index in [0, n) by Zipf(1) popularity.
  int Zipf(int n) {
    double total = 0;
    for (int i = 1; i <= n; ++i) total += 1.0 / i;
    double r = Uniform() * total;
    for (int i = 1; i <= n; ++i) {
      r -= 1.0 / i;
      if (r <= 0) return i - 1;
    }
    return n - 1;
  }

 private:
  std::mt19937_64 g_;
};

int Length(Rng& rng, double mean, double cv, double scale, int max) {
  const double v = rng.LogNormal(std::max(1.0, mean * scale), cv);
  return std::clamp(static_cast<int>(std::lround(v)), 1, max);
}

TraceRecord Request(const std::string& id, const std::string& model, double t, Rng& rng,
                    const LengthParams& L) {
  TraceRecord r;
  r.id = id;
  r.model = model;
  r.arrival_s = t;
  r.prompt_tokens = Length(rng, L.prompt_mean, L.prompt_cv, L.scale, L.prompt_max);
  r.output_tokens = Length(rng, L.output_mean, L.output_cv, L.scale, L.output_max);
  return r;
}

void SortByArrival(std::vector<TraceRecord>* v) {
  std::stable_sort(v->begin(), v->end(), [](const TraceRecord& a, const TraceRecord& b) {
    return a.arrival_s < b.arrival_s;
  });
}

}  // namespace

std::vector<TraceRecord> GenerateArrivals(const ArrivalParams& p) {
  Rng rng(p.seed);
  std::vector<TraceRecord> out;
  int n = 0;
  for (size_t m = 0; m < p.models.size(); ++m) {
    const double rate = p.rates.empty() ? 1.0 : p.rates[std::min(m, p.rates.size() - 1)];
    if (rate <= 0) continue;
    for (double t = rng.Gap(rate, p.process, p.cv); t < p.duration_s;
         t += rng.Gap(rate, p.process, p.cv)) {
      out.push_back(Request("", p.models[m], t, rng, p.lengths));
    }
  }
  SortByArrival(&out);
  for (auto& r : out) r.id = absl::StrCat("r", n++);
  return out;
}

absl::StatusOr<std::vector<TraceRecord>> GenerateShareGpt(const ShareGptParams& p) {
  if (p.models.empty())
    return absl::InvalidArgumentError("--models: expected at least one model name");
  if (p.requests < 1) return absl::InvalidArgumentError("--requests: must be >= 1");
  if (!(p.scale > 0)) return absl::InvalidArgumentError("--length-scale: must be > 0");
  if (!(p.prompt_mean > 0) || !(p.output_mean > 0) || p.prompt_cv < 0 || p.output_cv < 0) {
    return absl::InvalidArgumentError("--prompt-mean, --output-mean: must be > 0; CVs >= 0");
  }
  const auto limit = [&](int v) { return static_cast<int>(std::lround(v * p.scale)); };
  const int prompt_max = limit(p.prompt_max), total_max = limit(p.total_max);
  const int min_tokens = std::max(1, limit(p.min_tokens));
  if (prompt_max < min_tokens || total_max < 2 * min_tokens) {
    return absl::InvalidArgumentError(absl::StrCat(
        "no request fits: after --length-scale, --prompt-max is ", prompt_max, " and --total-max ",
        total_max, ", against --min-tokens ", min_tokens, " for prompt and output each"));
  }
  Rng rng(p.seed);
  const auto draw = [&](double mean, double cv) {
    return static_cast<int>(std::lround(rng.LogNormal(std::max(1.0, mean * p.scale), cv)));
  };
  std::vector<TraceRecord> out;
  out.reserve(static_cast<size_t>(p.requests));
  for (int i = 0; i < p.requests; ++i) {
    TraceRecord r;
    r.id = absl::StrCat("r", i);
    r.model = p.models[static_cast<size_t>(i) % p.models.size()];
    for (int tries = 0;; ++tries) {  // the dataset filter, as rejection
      if (tries == 100000) {
        return absl::InvalidArgumentError(
            "the length filter keeps almost no draws: bring the means within --prompt-max and "
            "--total-max");
      }
      r.prompt_tokens = draw(p.prompt_mean, p.prompt_cv);
      r.output_tokens = draw(p.output_mean, p.output_cv);
      if (r.prompt_tokens >= min_tokens && r.output_tokens >= min_tokens &&
          r.prompt_tokens <= prompt_max && r.prompt_tokens + r.output_tokens <= total_max) {
        break;
      }
    }
    out.push_back(std::move(r));
  }
  return out;
}

std::vector<TraceRecord> GenerateBursty(const BurstyParams& p) {
  Rng rng(p.seed);
  std::vector<TraceRecord> out;
  const int nm = static_cast<int>(p.models.size());
  const int persistent = std::max(1, static_cast<int>(std::lround(p.persistent_fraction * nm)));
  for (int m = 0; m < std::min(persistent, nm); ++m) {
    for (double t = rng.Gap(p.persistent_rate, "gamma", p.cv); t < p.duration_s;
         t += rng.Gap(p.persistent_rate, "gamma", p.cv)) {
      out.push_back(Request("", p.models[m], t, rng, p.lengths));
    }
  }
  // Sporadic models burst in groups.
  if (persistent < nm) {
    for (double t = rng.Exp(1.0 / p.group_interval_s); t < p.duration_s;
         t += rng.Exp(1.0 / p.group_interval_s)) {
      const double end = std::min(p.duration_s, t + rng.Exp(1.0 / p.on_mean_s));
      std::vector<int> members;
      for (int m = persistent; m < nm; ++m)
        if (rng.Bernoulli(p.group_fraction)) members.push_back(m);
      if (members.empty())
        members.push_back(persistent + static_cast<int>(rng.Uniform() * (nm - persistent)));
      for (int m : members) {
        // Each member opens the burst with a request, then Gamma arrivals.
        for (double a = t; a < end; a += rng.Gap(p.burst_rate, "gamma", p.burst_cv)) {
          out.push_back(Request("", p.models[m], a, rng, p.lengths));
        }
      }
    }
  }
  SortByArrival(&out);
  int n = 0;
  for (auto& r : out) r.id = absl::StrCat("r", n++);
  return out;
}

std::vector<TraceRecord> GenerateChat(const ChatParams& p) {
  Rng rng(p.seed);
  std::vector<TraceRecord> out;
  int s = 0;
  for (double t0 = rng.Exp(p.session_rate); t0 < p.duration_s; t0 += rng.Exp(p.session_rate), ++s) {
    const std::string session = absl::StrCat("chat-", s);
    const std::string model = p.models[rng.Zipf(static_cast<int>(p.models.size()))];
    const int turns = rng.Turns(p.turns_mean, p.turns_max);
    std::string prev;
    int prev_output = 0;
    double nominal = t0;
    for (int k = 1; k <= turns; ++k) {
      const std::string id = absl::StrCat(session, "-t", k);
      const double typing = rng.LogNormal(p.typing_mean_s, p.typing_cv);
      const double reading = prev_output / p.reading_tokens_per_s;
      TraceRecord r = Request(id, model, nominal, rng, p.lengths);
      r.session = session;
      r.turn = k;
      if (!prev.empty()) {
        r.after = prev;
        r.delay_s = reading + typing;
      }
      // The advisory goes out when typing starts: `typing` before the request.
      if (!rng.Bernoulli(p.advise_miss)) {
        TraceRecord a;
        a.type = TraceRecord::Type::kAdvise;
        a.id = absl::StrCat(session, "-a", k);
        a.model = model;
        a.session = session;
        a.turn = k;
        a.for_request = id;
        a.expected_arrival_s = typing;
        // The nominal arrival (for ordering; a chained advisory replays by
        // `after` + `delay_s`) never precedes the trace's start.
        a.arrival_s = std::max(0.0, nominal - typing);
        if (!prev.empty()) {
          a.after = prev;
          a.delay_s = reading;
        }
        out.push_back(a);
      }
      out.push_back(r);
      prev = id;
      prev_output = r.output_tokens;
      nominal += typing + reading + 1.0;  // ~1 s for the reply itself
    }
    if (rng.Bernoulli(p.advise_spurious)) {
      TraceRecord a;
      a.type = TraceRecord::Type::kAdvise;
      a.id = absl::StrCat(session, "-spurious");
      a.model = model;
      a.session = session;
      a.turn = turns + 1;
      a.after = prev;
      a.delay_s = prev_output / p.reading_tokens_per_s;
      a.arrival_s = nominal;
      out.push_back(a);
    }
  }
  // Keep dependency order valid: records sorted by nominal time per session
  // already precede their dependents; a stable sort by the root arrival
  // would break "after" order, so sessions stay contiguous.
  return out;
}

std::vector<TraceRecord> GenerateAgents(const AgentParams& p) {
  // Call graph: name, next hops with probabilities (the rest ends).
  struct Agent {
    std::string name;
    std::vector<std::pair<int, double>> next;
  };
  const std::vector<Agent> graph = {
      {"planner", {{1, 1.0}}},
      {"coder", {{2, 0.5}, {3, 0.5}}},
      {"reviewer", {{1, 0.3}}},
      {"tester", {{1, 0.4}}},
  };
  Rng rng(p.seed);
  std::vector<TraceRecord> out;
  int w = 0;
  for (double t0 = rng.Exp(p.workflow_rate); t0 < p.duration_s;
       t0 += rng.Exp(p.workflow_rate), ++w) {
    const std::string wf = absl::StrCat("wf-", w);
    int agent = 0;
    std::string prev;
    double nominal = t0, delay = 0;
    std::map<int, int> turns;
    for (int step = 0; step < p.max_steps && agent >= 0; ++step) {
      const Agent& a = graph[agent];
      const std::string model = p.models[agent % p.models.size()];
      const std::string id = absl::StrCat(wf, "-s", step);
      TraceRecord r = Request(id, model, nominal, rng, p.lengths);
      r.session = absl::StrCat(wf, "-", a.name);
      r.turn = ++turns[agent];
      if (!prev.empty()) {
        r.after = prev;
        r.delay_s = delay;
      }
      // Choose the next hop now so the advisories know which one is real.
      int next = -1;
      double u = rng.Uniform();
      for (const auto& [to, prob] : a.next) {
        if (u < prob) {
          next = to;
          break;
        }
        u -= prob;
      }
      const std::string next_id = absl::StrCat(wf, "-s", step + 1);
      for (const auto& [to, prob] : a.next) {
        TraceRecord adv;
        adv.type = TraceRecord::Type::kAdvise;
        adv.id = absl::StrCat(wf, "-s", step, "-advise-", graph[to].name);
        adv.model = p.models[to % p.models.size()];
        adv.session = absl::StrCat(wf, "-", graph[to].name);
        adv.arrival_s = nominal;
        adv.after = r.after;
        adv.delay_s = r.delay_s;
        adv.for_request = (to == next && step + 1 < p.max_steps) ? next_id : "";
        adv.next_hops = {adv.model};
        out.push_back(adv);
      }
      out.push_back(r);
      prev = id;
      delay = rng.Exp(1.0 / p.tool_mean_s);
      nominal += delay + 1.0;
      agent = next;
    }
  }
  return out;
}

namespace {

// The median; the mean of the two middle values for an even count.
double Median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

// Idle gaps > 10 s of one model's sorted arrivals over [0, end], counting the
// idle time before its first arrival and after its last.
double IdleGaps(const std::vector<double>& a, double end) {
  double prev = 0, gaps = 0;
  for (double t : a) {
    gaps += t - prev > 10.0;
    prev = t;
  }
  return gaps + (end - prev > 10.0);
}

// Mean active fraction and active-set changes on a 1 s grid; a model is
// active at t if it had an arrival in (t - window_s, t].
void ActiveSets(const std::map<std::string, std::vector<double>>& arrivals, double window_s,
                TraceStats* s) {
  const int steps = static_cast<int>(s->duration_s);
  std::vector<size_t> cursor(arrivals.size(), 0);
  std::vector<bool> prev_set(arrivals.size(), false);
  double active_sum = 0;
  int changes = 0;
  for (int t = 1; t <= steps; ++t) {
    size_t i = 0;
    int active = 0;
    bool changed = false;
    for (const auto& [m, a] : arrivals) {
      while (cursor[i] < a.size() && a[cursor[i]] <= t) ++cursor[i];
      const bool on = cursor[i] > 0 && a[cursor[i] - 1] > t - window_s;
      active += on;
      changed |= on != prev_set[i];
      prev_set[i] = on;
      ++i;
    }
    active_sum += static_cast<double>(active) / static_cast<double>(arrivals.size());
    changes += changed;
  }
  s->mean_active_fraction = steps > 0 ? active_sum / steps : 0;
  s->active_set_changes_per_hour = changes / (s->duration_s / 3600.0);
}

// Mean and CV of the requests' prompt (synthesised ones) and output lengths.
void LengthMoments(const std::vector<TraceRecord>& trace, TraceStats* s) {
  std::vector<double> prompts, outputs;
  for (const auto& r : trace) {
    if (!r.is_request()) continue;
    if (r.prompt.empty()) prompts.push_back(r.prompt_tokens);
    outputs.push_back(r.output_tokens);
  }
  const auto moments = [](const std::vector<double>& v, double* mean, double* cv) {
    if (v.empty()) return;
    double sum = 0, sq = 0;
    for (double x : v) sum += x;
    *mean = sum / static_cast<double>(v.size());
    for (double x : v) sq += (x - *mean) * (x - *mean);
    const double sd = v.size() > 1 ? std::sqrt(sq / static_cast<double>(v.size() - 1)) : 0;
    *cv = *mean > 0 ? sd / *mean : 0;
  };
  moments(prompts, &s->prompt_tokens_mean, &s->prompt_tokens_cv);
  moments(outputs, &s->output_tokens_mean, &s->output_tokens_cv);
}

}  // namespace

TraceStats ComputeStats(const std::vector<TraceRecord>& trace, double window_s,
                        const std::vector<std::string>& models) {
  TraceStats s;
  // Every model named (catalogue, advisories included) counts, idle or not.
  std::map<std::string, std::vector<double>> arrivals;
  for (const auto& m : models) arrivals[m];
  std::set<std::string> sessions;
  for (const auto& r : trace) {
    if (!r.model.empty()) arrivals[r.model];
    if (!r.is_request()) {
      ++s.advisories;
      continue;
    }
    ++s.requests;
    arrivals[r.model].push_back(r.arrival_s);
    s.requests_per_model[r.model]++;
    if (!r.session.empty()) sessions.insert(r.session);
    s.duration_s = std::max(s.duration_s, r.arrival_s);
  }
  s.sessions = static_cast<int>(sessions.size());
  LengthMoments(trace, &s);
  s.models = static_cast<int>(arrivals.size());
  if (arrivals.empty() || s.duration_s <= 0) return s;
  std::vector<double> cvs, gaps;
  for (auto& [m, a] : arrivals) {
    std::sort(a.begin(), a.end());
    if (a.size() >= 3) {
      double mean = 0, var = 0;
      for (size_t i = 1; i < a.size(); ++i) mean += a[i] - a[i - 1];
      mean /= static_cast<double>(a.size() - 1);
      for (size_t i = 1; i < a.size(); ++i) var += std::pow(a[i] - a[i - 1] - mean, 2);
      var /= static_cast<double>(a.size() - 2);
      cvs.push_back(mean > 0 ? std::sqrt(var) / mean : 0);
    }
    gaps.push_back(IdleGaps(a, s.duration_s));
  }
  s.idle_gaps_per_hour = Median(gaps) / (s.duration_s / 3600.0);
  if (!cvs.empty()) {
    s.median_interarrival_cv = Median(cvs);
    s.fraction_models_cv_above_1 =
        static_cast<double>(std::count_if(cvs.begin(), cvs.end(), [](double c) { return c > 1; })) /
        static_cast<double>(cvs.size());
  }
  ActiveSets(arrivals, window_s, &s);
  return s;
}

std::string FormatStats(const TraceStats& s) {
  std::string out = absl::StrFormat(
      "%d requests, %d advisories, %d sessions, %d models over %.0f s\n"
      "mean active fraction %.1f%% (Prism: 23-50%%), active-set changes %.0f/h (Prism: 54-766)\n"
      "median inter-arrival CV %.2f, %.0f%% of models above 1; idle gaps > 10 s: %.0f/h "
      "(median model; Prism: 40-100)\n",
      s.requests, s.advisories, s.sessions, s.models, s.duration_s, 100 * s.mean_active_fraction,
      s.active_set_changes_per_hour, s.median_interarrival_cv, 100 * s.fraction_models_cv_above_1,
      s.idle_gaps_per_hour);
  if (s.prompt_tokens_mean > 0) {  // text prompts have no synthesised length
    out += absl::StrFormat("prompt tokens mean %.1f (CV %.2f), ", s.prompt_tokens_mean,
                           s.prompt_tokens_cv);
  }
  out += absl::StrFormat("output tokens mean %.1f (CV %.2f)\n", s.output_tokens_mean,
                         s.output_tokens_cv);
  for (const auto& [m, n] : s.requests_per_model) out += absl::StrFormat("  %-16s %d\n", m, n);
  return out;
}

}  // namespace ballast::bench
