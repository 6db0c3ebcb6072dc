#include "server/sim_cli.h"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iostream>
#include <limits>
#include <sstream>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "bench/plots.h"
#include "bench/report.h"
#include "server/bench_commands.h"
#include "server/cli_lists.h"
#include "server/sim_config.h"
#include "sim/simulator.h"
#include "sim/step_replay.h"

namespace ballast::server {

namespace fs = std::filesystem;

struct SimCli::State {
  CLI::App* cmd = nullptr;
  CLI::App* sweep = nullptr;
  CLI::App* steps = nullptr;
  std::string config, trace, out = "sim-out", policies, gpus, scales = "1", slo_scales = "1";
  // `simulate steps`
  std::string calibration, shape = "llama-8b", steps_csv, steps_out;
  int weight_bytes = 2, kv_bytes = 2;
  double slo_scale = 1, target = 0.99;
  bool plots = true;
  bool step_log = false;
  int repeats = 1;
  double jitter_ms = 0;
};

SimCli::SimCli(CLI::App* app) : s_(std::make_unique<State>()) {
  State& s = *s_;
  s.cmd = app->add_subcommand(
      "simulate", "replay a trace on a simulated cluster (the real policies, a virtual clock)");
  auto common = [&](CLI::App* c) {
    // Checked in RunParsed: CLI11 would demand them of `simulate` when
    // `simulate sweep` has them.
    c->add_option("--config", s.config, "simulation config (configs/sim/*.yaml), required");
    c->add_option("--trace", s.trace, "trace file (ballast trace ...), required");
    c->add_option("--out", s.out, "output directory")->capture_default_str();
    c->add_flag("!--no-plots", s.plots, "skip the PNG plots");
  };
  common(s.cmd);
  s.cmd->add_option("--slo-scale", s.slo_scale, "multiplies every SLO")->capture_default_str();
  s.cmd->add_option("--policy", s.policies,
                    "a variant from the config's `policies` (default: "
                    "`policy`)");
  s.cmd->add_option("--gpus", s.gpus, "GPUs in all (overrides cluster.nodes)");
  s.cmd->add_option("--rate-scale", s.scales, "comma-separated arrival-rate multipliers")
      ->capture_default_str();
  s.cmd
      ->add_option("--repeats", s.repeats,
                   "runs per rate scale: the trace as it is, then with each arrival moved by up "
                   "to --jitter-ms (an ensemble: mean, min and max in the report and "
                   "result.json)")
      ->capture_default_str();
  s.cmd->add_option("--jitter-ms", s.jitter_ms, "the ensemble's arrival jitter, milliseconds")
      ->capture_default_str();
  s.cmd->add_flag("--step-log", s.step_log,
                  "also write every model step to steps-<rate>.csv and every change in a "
                  "queued request's arbitration state to arbitration-<rate>.csv "
                  "(scripts/step-timeline.py and scripts/arbitration-timeline.py line them up "
                  "with a node's logs)");
  s.sweep = s.cmd->add_subcommand("sweep", "the fewest GPUs meeting the SLOs, per policy");
  common(s.sweep);
  s.sweep
      ->add_option("--slo-scale", s.slo_scales,
                   "comma-separated SLO multipliers; each run is judged at every one")
      ->capture_default_str();
  s.sweep->add_option("--gpus", s.gpus, "comma-separated GPU counts, required");
  s.sweep->add_option("--policy", s.policies,
                      "comma-separated variants (default: every one in `policies`)");
  s.sweep->add_option("--rate-scale", s.scales, "arrival-rate multiplier")->capture_default_str();
  s.sweep->add_option("--target", s.target, "attainment to reach (TTFT and TPOT)")
      ->capture_default_str();
  s.steps = s.cmd->add_subcommand(
      "steps", "recorded engine steps (scripts/step-log.py) against the calibrated model");
  s.steps->add_option("--calibration", s.calibration, "configs/sim/calibration-<card>.json")
      ->required();
  s.steps->add_option("--steps", s.steps_csv, "CSV of steps (sim/step_replay.h)")->required();
  s.steps->add_option("--shape", s.shape, "the model's shape (llama-1b, llama-8b, ...)")
      ->capture_default_str();
  s.steps->add_option("--weight-dtype-bytes", s.weight_bytes, "2 (BF16) or 1 (FP8)")
      ->check(CLI::IsMember({1, 2}))
      ->capture_default_str();
  s.steps->add_option("--kv-dtype-bytes", s.kv_bytes, "2 (BF16) or 1 (FP8 E4M3)")
      ->check(CLI::IsMember({1, 2}))
      ->capture_default_str();
  s.steps->add_option("--out", s.steps_out, "also write each step with its predicted ms (CSV)");
}

SimCli::~SimCli() = default;

namespace {

int Fail(const std::string& msg) {
  std::cerr << "error: " << msg << "\n";
  return 2;
}

// `gpus` GPUs in all, on nodes of the config's gpus_per_node (the last
// one smaller when it does not divide).
void SetGpus(int gpus, sim::SimCluster* c) {
  c->nodes = (gpus + c->gpus_per_node - 1) / c->gpus_per_node;
  c->gpus = gpus;
}

struct Loaded {
  SimFile file;
  sim::Calibration calibration;
  std::unique_ptr<sim::EngineModel> engine;
  std::vector<bench::TraceRecord> trace;
};

absl::StatusOr<Loaded> Load(const SimCli::State& s) {
  Loaded l;
  auto file = ReadSimConfig(s.config);
  if (!file.ok()) return file.status();
  l.file = *std::move(file);
  auto cal = sim::ReadCalibration(l.file.calibration_path);
  if (!cal.ok()) return cal.status();
  l.calibration = *std::move(cal);
  auto engine = sim::EngineModel::Fit(l.calibration);
  if (!engine.ok()) return engine.status();
  l.engine = std::make_unique<sim::EngineModel>(*engine);
  if (l.file.config.cluster.gpu_memory_bytes == 0) {
    l.file.config.cluster.gpu_memory_bytes = l.calibration.memory_bytes;
  }
  auto trace = bench::ReadTrace(s.trace);
  if (!trace.ok()) return trace.status();
  l.trace = *std::move(trace);
  if (std::none_of(l.trace.begin(), l.trace.end(),
                   [](const bench::TraceRecord& r) { return r.is_request(); })) {
    return absl::InvalidArgumentError(absl::StrCat(s.trace, ": the trace has no requests"));
  }
  if (!(s.slo_scale > 0)) return absl::InvalidArgumentError("--slo-scale must be > 0");
  if (!(s.target > 0 && s.target <= 1))
    return absl::InvalidArgumentError("--target must be in (0, 1]");
  std::error_code ec;
  std::filesystem::create_directories(s.out, ec);
  if (ec) {
    return absl::InvalidArgumentError(
        absl::StrCat("--out ", s.out, ": cannot create the directory: ", ec.message()));
  }
  return l;
}

absl::StatusOr<sim::SimPolicy> Variant(const SimFile& f, const std::string& name) {
  if (name.empty()) return f.config.policy;
  auto it = f.variants.find(name);
  if (it == f.variants.end()) {
    std::vector<std::string> names;
    for (const auto& [n, p] : f.variants) names.push_back(n);
    return absl::NotFoundError(absl::StrCat("policy \"", name,
                                            "\" is not in the config's "
                                            "`policies` (has: ",
                                            absl::StrJoin(names, ", "), ")"));
  }
  return it->second;
}

nlohmann::json EngineJson(const Loaded& l) {
  return {{"device", l.calibration.device},
          {"calibrated", l.calibration.date},
          {"coefficients", l.engine->coefficients()},
          {"overlap_per_layer_s", l.engine->overlap_per_layer_s()},
          {"stream_share", l.engine->stream_share()},
          {"ridge_tokens", l.engine->ridge_tokens()}};
}

// The figures an ensemble summarises, of one run.
std::vector<std::pair<std::string, double>> EnsembleFigures(const bench::Report& r) {
  return {{"slo_attainment", r.total.slo_attainment},
          {"ttft_p50_ms", r.total.ttft_ms.p50},
          {"ttft_p99_ms", r.total.ttft_ms.p99},
          {"tpot_p50_ms", r.total.tpot_ms.p50},
          {"token_throughput", r.token_throughput}};
}

// Runs 2..s.repeats of rate scale k on jittered arrivals (JitterArrivals,
// seeds 1, 2, ...) beside `first` (the trace as it is): each figure's
// runs, mean, min and max, and a line of the report per figure.
absl::StatusOr<nlohmann::json> Ensemble(const SimCli::State& s, const sim::SimConfig& config,
                                        const Loaded& l, double k, const bench::Report& first) {
  std::vector<std::vector<std::pair<std::string, double>>> figures = {EnsembleFigures(first)};
  for (int i = 1; i < s.repeats; ++i) {
    auto trace = sim::JitterArrivals(l.trace, s.jitter_ms / 1e3, k, static_cast<uint64_t>(i));
    auto res = sim::Simulate(config, *l.engine, trace, k);
    if (!res.ok()) return res.status();
    const bench::Report rep =
        bench::Summarize(res->replay, s.slo_scale, std::numeric_limits<double>::infinity());
    if (!rep.accounting_ok) {
      return absl::InternalError(
          absl::StrCat("ensemble run ", i + 1, " at rate scale ", k, ": accounting mismatch"));
    }
    figures.push_back(EnsembleFigures(rep));
  }
  nlohmann::json j = {{"repeats", s.repeats}, {"jitter_ms", s.jitter_ms}};
  std::cout << absl::StrFormat("ensemble of %d runs (arrivals moved by up to %g ms):\n", s.repeats,
                               s.jitter_ms);
  for (size_t f = 0; f < figures[0].size(); ++f) {
    std::vector<double> v;
    for (const auto& run : figures) v.push_back(run[f].second);
    double sum = 0;
    for (double x : v) sum += x;
    const double mean = sum / static_cast<double>(v.size());
    const auto [lo, hi] = std::minmax_element(v.begin(), v.end());
    j[figures[0][f].first] = {{"runs", v}, {"mean", mean}, {"min", *lo}, {"max", *hi}};
    std::cout << absl::StrFormat("  %-17s mean %.4g, min %.4g, max %.4g\n", figures[0][f].first,
                                 mean, *lo, *hi);
  }
  return j;
}

int RunSimulate(const SimCli::State& s) {
  std::vector<double> scales;
  if (!ParsePositiveList(s.scales, &scales)) return Fail("--rate-scale: expected positive numbers");
  if (s.repeats < 1) return Fail("--repeats: at least 1");
  if (!(s.jitter_ms >= 0)) return Fail("--jitter-ms: at least 0");
  if (s.repeats > 1 && s.jitter_ms == 0) {
    return Fail("--repeats above 1 needs --jitter-ms above 0 (else every run is the same)");
  }
  if (s.repeats == 1 && s.jitter_ms > 0) {
    return Fail("--jitter-ms applies to an ensemble's runs after the first: add --repeats N");
  }
  auto l = Load(s);
  if (!l.ok()) return Fail(std::string(l.status().message()));
  sim::SimConfig config = l->file.config;
  auto policy = Variant(l->file, s.policies);
  if (!policy.ok()) return Fail(std::string(policy.status().message()));
  config.policy = *policy;
  if (!s.gpus.empty()) {
    int gpus = 0;
    if (!absl::SimpleAtoi(s.gpus, &gpus) || gpus <= 0) return Fail("--gpus: a positive integer");
    SetGpus(gpus, &config.cluster);
  }
  std::vector<bench::ReplayResult> runs;
  std::vector<bench::Report> reports;
  nlohmann::json json = {{"trace", s.trace},
                         {"config", s.config},
                         {"engine", EngineJson(*l)},
                         {"runs", nlohmann::json::array()}};
  for (double k : scales) {
    auto res = sim::Simulate(config, *l->engine, l->trace, k, s.step_log);
    if (!res.ok()) return Fail(std::string(res.status().message()));
    if (s.step_log) {
      WriteFileAtomic(fs::path(s.out) / absl::StrCat("steps-", k, ".csv"),
                      sim::StepsCsv(config, res->steps));
      WriteFileAtomic(fs::path(s.out) / absl::StrCat("arbitration-", k, ".csv"),
                      sim::ArbitrationCsv(res->arbitration));
    }
    bench::Report rep =
        bench::Summarize(res->replay, s.slo_scale, std::numeric_limits<double>::infinity());
    std::cout << bench::FormatReport(rep) << "\n"
              << "simulation: " << sim::ToJson(res->stats).dump() << std::endl;
    if (auto st = bench::WriteRequestsCsv(
            (fs::path(s.out) / absl::StrCat("requests-", k, ".csv")).string(), res->replay,
            s.slo_scale);
        !st.ok()) {
      return Fail(std::string(st.message()));
    }
    nlohmann::json run = bench::ToJson(rep);
    run["simulation"] = sim::ToJson(res->stats);
    if (s.repeats > 1) {
      auto e = Ensemble(s, config, *l, k, rep);
      if (!e.ok()) return Fail(std::string(e.status().message()));
      run["ensemble"] = *std::move(e);
    }
    json["runs"].push_back(run);
    WriteFileAtomic(fs::path(s.out) / "result.json", json.dump(2) + "\n");
    if (!rep.accounting_ok) return Fail("accounting mismatch (see the report)");
    runs.push_back(std::move(res->replay));
    reports.push_back(rep);
  }
  if (s.plots) {
    auto pngs = bench::RenderPlots(s.out, runs, reports, 0);
    if (pngs.ok()) {
      std::cout << "plots: " << absl::StrJoin(*pngs, ", ") << std::endl;
    } else {
      std::cerr << "warning: no plots: " << pngs.status().message() << "\n";
    }
  }
  std::cout << "results: " << (fs::path(s.out) / "result.json").string() << std::endl;
  return 0;
}

// One policy's sweep: attainment[gpu index][scale index] = (TTFT, TPOT).
struct PolicySweep {
  std::string name;
  std::vector<std::vector<std::pair<double, double>>> attainment;
};

// The fewest of `gpus` at which `met` holds for the policy at SLO scale
// index k; 0 when none does.
template <typename Met>
int Fewest(const PolicySweep& p, const std::vector<int>& gpus, size_t k, Met met) {
  for (size_t g = 0; g < gpus.size(); ++g) {
    if (met(p.attainment[g][k])) return gpus[g];
  }
  return 0;
}

// A cell of the cost-saving tables: the fewest GPUs (or "> max") and its
// ratio to the first policy's; a bound where only one of them is known
// (the unknown one needs more than `max_gpus`).
std::string SavingCell(int fewest, int base, int max_gpus) {
  const std::string gpus = fewest ? absl::StrCat(fewest) : absl::StrCat("> ", max_gpus);
  if (base == 0 && fewest == 0) return gpus + " (n/a)";
  if (base == 0) return absl::StrFormat("%s (< %.2f)", gpus, double(fewest) / max_gpus);
  if (fewest == 0) return absl::StrFormat("%s (> %.2f)", gpus, double(max_gpus) / base);
  return absl::StrFormat("%s (%.2f)", gpus, double(fewest) / base);
}

// sweep.md: for TTFT and TPOT alone and for both, the fewest GPUs reaching
// the target per policy (rows) and SLO scale (columns), with the ratio to
// the first policy's (Prism's Figure 9(b)). The same counts go into
// `json`'s policies.<name>.fewest_gpus_by_slo_scale (null: not within the
// sweep), and both metrics' at the first scale into its fewest_gpus.
std::string SavingTables(const std::vector<PolicySweep>& ps, const std::vector<int>& gpus,
                         const std::vector<double>& slo, double target, nlohmann::json* json) {
  using Att = std::pair<double, double>;
  struct Metric {
    const char* what;
    const char* key;
    std::function<bool(const Att&)> met;
  };
  const Metric metrics[] = {{"TTFT and TPOT", "both",
                             [&](const Att& a) { return a.first >= target && a.second >= target; }},
                            {"TTFT", "ttft", [&](const Att& a) { return a.first >= target; }},
                            {"TPOT", "tpot", [&](const Att& a) { return a.second >= target; }}};
  for (const PolicySweep& p : ps) {
    nlohmann::json& by = (*json)["policies"][p.name]["fewest_gpus_by_slo_scale"];
    by = nlohmann::json::array();
    for (size_t k = 0; k < slo.size(); ++k) {
      nlohmann::json row = {{"slo_scale", slo[k]}};
      for (const Metric& m : metrics) {
        const int f = Fewest(p, gpus, k, m.met);
        row[m.key] = f ? nlohmann::json(f) : nlohmann::json(nullptr);
      }
      by.push_back(row);
    }
    (*json)["policies"][p.name]["fewest_gpus"] = by[0]["both"];  // at the first SLO scale
  }
  std::string md;
  for (const Metric& m : metrics) {
    absl::StrAppendFormat(&md,
                          "Fewest GPUs with %s attainment >= %.0f%% (GPUs / %s's), by SLO scale\n\n"
                          "| policy |",
                          m.what, 100 * target, ps.front().name);
    for (double k : slo) absl::StrAppend(&md, " ", k, " |");
    absl::StrAppend(&md, "\n|---|",
                    absl::StrJoin(std::vector<std::string>(slo.size(), "---:"), "|"), "|\n");
    for (const PolicySweep& p : ps) {
      absl::StrAppend(&md, "| ", p.name, " |");
      for (size_t k = 0; k < slo.size(); ++k) {
        absl::StrAppend(
            &md, " ",
            SavingCell(Fewest(p, gpus, k, m.met), Fewest(ps.front(), gpus, k, m.met), gpus.back()),
            " |");
      }
      absl::StrAppend(&md, "\n");
    }
    absl::StrAppend(&md, "\n");
  }
  return md;
}

// Runs one policy at every GPU count (rate scale `rate`), judging each run
// at every SLO scale: fills `out`, appends CSV rows, returns its JSON.
absl::StatusOr<nlohmann::json> SweepPolicy(const Loaded& l, const sim::SimPolicy& policy,
                                           const std::vector<int>& gpus, double rate,
                                           const std::vector<double>& slo, PolicySweep* out,
                                           std::string* csv) {
  nlohmann::json pj = {{"runs", nlohmann::json::array()}};
  for (int g : gpus) {
    sim::SimConfig config = l.file.config;
    config.policy = policy;
    SetGpus(g, &config.cluster);
    auto res = sim::Simulate(config, *l.engine, l.trace, rate);
    if (!res.ok()) return res.status();
    nlohmann::json run = {{"gpus", g},
                          {"simulation", sim::ToJson(res->stats)},
                          {"by_slo_scale", nlohmann::json::array()}};
    out->attainment.emplace_back();
    for (double k : slo) {  // one simulation, judged at every SLO scale
      const bench::Report rep =
          bench::Summarize(res->replay, k, std::numeric_limits<double>::infinity());
      const double ttft = rep.total.ttft_attainment, tpot = rep.total.tpot_attainment;
      std::cout << absl::StrFormat("%-20s %5d GPUs, SLO x%g: TTFT %.1f%% TPOT %.1f%% (%.1f s)\n",
                                   out->name, g, k, 100 * ttft, 100 * tpot, res->stats.wall_s)
                << std::flush;
      if (k == slo.front()) run["report"] = bench::ToJson(rep);
      run["by_slo_scale"].push_back({{"slo_scale", k}, {"ttft", ttft}, {"tpot", tpot}});
      out->attainment.back().push_back({ttft, tpot});
      absl::StrAppendFormat(csv, "%s,%d,%.6f,%.6f,%.4f,%.1f,%d,%d,%.2f,%g\n", out->name, g, ttft,
                            tpot, rep.goodput_rps, rep.total.ttft_ms.p99, res->stats.activations,
                            res->stats.idle_evictions + res->stats.kv_pressure_evictions,
                            res->stats.wall_s, k);
    }
    pj["runs"].push_back(run);
  }
  return pj;
}

int RunSweep(const SimCli::State& s) {
  std::vector<int> gpus;
  std::vector<double> scale, slo;
  if (!ParsePositiveList(s.gpus, &gpus))
    return Fail("sweep --gpus: expected positive integers, e.g. 4,8,16");
  if (!ParsePositiveList(s.scales, &scale) || scale.size() != 1) {
    return Fail("--rate-scale: one positive number");
  }
  if (!ParsePositiveList(s.slo_scales, &slo)) {
    return Fail("sweep --slo-scale: expected positive numbers, e.g. 1,2,5");
  }
  if (s.slo_scale != 1) {  // `simulate --slo-scale K sweep`: the sweep's own list decides
    return Fail("give --slo-scale after `sweep` (a list, e.g. sweep --slo-scale 1,5)");
  }
  auto l = Load(s);
  if (!l.ok()) return Fail(std::string(l.status().message()));
  std::vector<std::string> names = SplitList(s.policies);
  if (names.empty()) {
    for (const auto& [n, p] : l->file.variants) names.push_back(n);
  }
  if (names.empty()) return Fail("no policies: give --policy or a `policies` section");
  std::sort(gpus.begin(), gpus.end());
  std::vector<PolicySweep> sweeps;
  nlohmann::json json = {{"trace", s.trace},
                         {"config", s.config},
                         {"engine", EngineJson(*l)},
                         {"target", s.target},
                         {"rate_scale", scale[0]},
                         {"slo_scales", slo},
                         {"policies", nlohmann::json::object()}};
  std::string csv =
      "policy,gpus,ttft_attainment,tpot_attainment,goodput_rps,ttft_p99_ms,"
      "activations,evictions,sim_wall_s,slo_scale\n";
  for (const std::string& name : names) {
    auto policy = Variant(l->file, name);
    if (!policy.ok()) return Fail(std::string(policy.status().message()));
    sweeps.push_back({name, {}});
    auto pj = SweepPolicy(*l, *policy, gpus, scale[0], slo, &sweeps.back(), &csv);
    if (!pj.ok()) return Fail(std::string(pj.status().message()));
    json["policies"][name] = *std::move(pj);
    WriteFileAtomic(fs::path(s.out) / "sweep.json", json.dump(2) + "\n");
    WriteFileAtomic(fs::path(s.out) / "sweep.csv", csv);
  }
  const std::string md = SavingTables(sweeps, gpus, slo, s.target, &json);
  WriteFileAtomic(fs::path(s.out) / "sweep.json", json.dump(2) + "\n");
  WriteFileAtomic(fs::path(s.out) / "sweep.md", md);
  std::cout << "\n" << md;
  if (s.plots) {
    bench::SweepTable table{names, gpus, {}};
    for (const PolicySweep& p : sweeps) {
      table.attainment.emplace_back();
      for (const auto& by_scale : p.attainment) table.attainment.back().push_back(by_scale[0]);
    }
    auto png = bench::RenderSweepPlot(s.out, table, s.target);
    if (!png.ok()) std::cerr << "warning: no plot: " << png.status().message() << "\n";
  }
  std::cout << "results: " << (fs::path(s.out) / "sweep.json").string() << std::endl;
  return 0;
}

// `simulate steps`: each recorded step's predicted time, and the sums by
// kind of step.
int RunSteps(const SimCli::State& s) {
  auto cal = sim::ReadCalibration(s.calibration);
  if (!cal.ok()) return Fail(std::string(cal.status().message()));
  auto model = sim::EngineModel::Fit(*cal);
  if (!model.ok()) return Fail(std::string(model.status().message()));
  auto shape = sim::NamedShape(s.shape);
  if (!shape.ok()) return Fail(std::string(shape.status().message()));
  shape->weight_dtype_bytes = s.weight_bytes;
  shape->kv_dtype_bytes = s.kv_bytes;
  std::ifstream in(s.steps_csv);
  if (!in) return Fail(absl::StrCat("--steps ", s.steps_csv, ": cannot read the file"));
  std::stringstream text;
  text << in.rdbuf();
  auto steps = sim::ParseRecordedSteps(text.str(), s.steps_csv);
  if (!steps.ok()) return Fail(std::string(steps.status().message()));
  if (!s.steps_out.empty()) {
    std::string csv =
        "decode_tokens,decode_context,prefill_tokens,prefill_attention,prefill_logits,ms,"
        "predicted_ms\n";
    for (const sim::RecordedStep& r : *steps) {
      const sim::StepWork& w = r.work;
      absl::StrAppendFormat(&csv, "%d,%.0f,%d,%.0f,%d,%.3f,%.3f\n", w.decode_tokens,
                            w.decode_context, w.prefill_tokens, w.prefill_attention,
                            w.prefill_logits, r.ms, model->StepSeconds(*shape, w) * 1e3);
    }
    WriteFileAtomic(s.steps_out, csv);
  }
  std::cout << absl::StrFormat("%s on %s (%s, calibrated %s): %d steps\n", s.shape, cal->device,
                               s.calibration, cal->date, steps->size())
            << absl::StrFormat("%-16s %7s %12s %12s %8s %14s\n", "steps", "count", "measured ms",
                               "model ms", "sum err", "median err");
  for (const sim::StepGroup& g : sim::CompareSteps(*model, *shape, *steps)) {
    std::cout << absl::StrFormat("%-16s %7d %12.1f %12.1f %+7.1f%% %+13.1f%%\n", g.name, g.steps,
                                 g.measured_ms, g.predicted_ms,
                                 100 * (g.predicted_ms / g.measured_ms - 1), 100 * g.median_error);
  }
  return 0;
}

}  // namespace

bool SimCli::RunParsed(int* rc) {
  if (!s_->cmd->parsed()) return false;
  if (s_->steps->parsed()) {
    *rc = RunSteps(*s_);
    return true;
  }
  if (s_->config.empty() || s_->trace.empty()) {
    *rc = Fail("simulate needs --config FILE and --trace FILE");
    return true;
  }
  *rc = s_->sweep->parsed() ? RunSweep(*s_) : RunSimulate(*s_);
  return true;
}

}  // namespace ballast::server
