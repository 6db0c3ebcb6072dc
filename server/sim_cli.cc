#include "server/sim_cli.h"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <iostream>
#include <limits>

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

namespace ballast::server {

namespace fs = std::filesystem;

struct SimCli::State {
  CLI::App* cmd = nullptr;
  CLI::App* sweep = nullptr;
  std::string config, trace, out = "sim-out", policies, gpus, scales = "1";
  double slo_scale = 1, target = 0.99;
  bool plots = true;
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
    c->add_option("--slo-scale", s.slo_scale, "multiplies every SLO")->capture_default_str();
    c->add_flag("!--no-plots", s.plots, "skip the PNG plots");
  };
  common(s.cmd);
  s.cmd->add_option("--policy", s.policies,
                    "a variant from the config's `policies` (default: "
                    "`policy`)");
  s.cmd->add_option("--gpus", s.gpus, "GPUs in all (overrides cluster.nodes)");
  s.cmd->add_option("--rate-scale", s.scales, "comma-separated arrival-rate multipliers")
      ->capture_default_str();
  s.sweep = s.cmd->add_subcommand("sweep", "the fewest GPUs meeting the SLOs, per policy");
  common(s.sweep);
  s.sweep->add_option("--gpus", s.gpus, "comma-separated GPU counts, required");
  s.sweep->add_option("--policy", s.policies,
                      "comma-separated variants (default: every one in `policies`)");
  s.sweep->add_option("--rate-scale", s.scales, "arrival-rate multiplier")->capture_default_str();
  s.sweep->add_option("--target", s.target, "attainment to reach (TTFT and TPOT)")
      ->capture_default_str();
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
          {"coefficients", l.engine->coefficients()}};
}

int RunSimulate(const SimCli::State& s) {
  std::vector<double> scales;
  if (!ParsePositiveList(s.scales, &scales)) return Fail("--rate-scale: expected positive numbers");
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
    auto res = sim::Simulate(config, *l->engine, l->trace, k);
    if (!res.ok()) return Fail(std::string(res.status().message()));
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

int RunSweep(const SimCli::State& s) {
  std::vector<int> gpus;
  std::vector<double> scale;
  if (!ParsePositiveList(s.gpus, &gpus))
    return Fail("sweep --gpus: expected positive integers, e.g. 4,8,16");
  if (!ParsePositiveList(s.scales, &scale) || scale.size() != 1) {
    return Fail("--rate-scale: one positive number");
  }
  auto l = Load(s);
  if (!l.ok()) return Fail(std::string(l.status().message()));
  std::vector<std::string> names = SplitList(s.policies);
  if (names.empty()) {
    for (const auto& [n, p] : l->file.variants) names.push_back(n);
  }
  if (names.empty()) return Fail("no policies: give --policy or a `policies` section");
  std::sort(gpus.begin(), gpus.end());
  bench::SweepTable table{names, gpus, {}};
  nlohmann::json json = {{"trace", s.trace},         {"config", s.config},
                         {"engine", EngineJson(*l)}, {"target", s.target},
                         {"rate_scale", scale[0]},   {"policies", nlohmann::json::object()}};
  std::string csv =
      "policy,gpus,ttft_attainment,tpot_attainment,goodput_rps,ttft_p99_ms,"
      "activations,evictions,sim_wall_s\n";
  for (const std::string& name : names) {
    auto policy = Variant(l->file, name);
    if (!policy.ok()) return Fail(std::string(policy.status().message()));
    nlohmann::json pj = {{"runs", nlohmann::json::array()}, {"fewest_gpus", nullptr}};
    table.attainment.emplace_back();
    for (int g : gpus) {
      sim::SimConfig config = l->file.config;
      config.policy = *policy;
      SetGpus(g, &config.cluster);
      auto res = sim::Simulate(config, *l->engine, l->trace, scale[0]);
      if (!res.ok()) return Fail(std::string(res.status().message()));
      const bench::Report rep =
          bench::Summarize(res->replay, s.slo_scale, std::numeric_limits<double>::infinity());
      const double ttft = rep.total.ttft_attainment, tpot = rep.total.tpot_attainment;
      const bool met = ttft >= s.target && tpot >= s.target;
      std::cout << absl::StrFormat("%-20s %5d GPUs: TTFT %.1f%% TPOT %.1f%%%s (%.1f s)\n", name, g,
                                   100 * ttft, 100 * tpot, met ? "  meets" : "", res->stats.wall_s)
                << std::flush;
      if (met && pj["fewest_gpus"].is_null()) pj["fewest_gpus"] = g;
      nlohmann::json run = {
          {"gpus", g}, {"report", bench::ToJson(rep)}, {"simulation", sim::ToJson(res->stats)}};
      pj["runs"].push_back(run);
      table.attainment.back().push_back({ttft, tpot});
      absl::StrAppendFormat(&csv, "%s,%d,%.6f,%.6f,%.4f,%.1f,%d,%d,%.2f\n", name, g, ttft, tpot,
                            rep.goodput_rps, rep.total.ttft_ms.p99, res->stats.activations,
                            res->stats.idle_evictions + res->stats.kv_pressure_evictions,
                            res->stats.wall_s);
    }
    json["policies"][name] = pj;
    WriteFileAtomic(fs::path(s.out) / "sweep.json", json.dump(2) + "\n");
    WriteFileAtomic(fs::path(s.out) / "sweep.csv", csv);
  }
  // The cost saving: each policy's GPUs against the first policy's (the
  // one to beat comes first on --policy); unknown where either never met
  // the target within the sweep.
  const auto& base = json["policies"][names.front()]["fewest_gpus"];
  std::string md = absl::StrFormat(
      "| policy | fewest GPUs with TTFT and TPOT attainment >= %.0f%% | GPUs / %s's |\n"
      "|---|---:|---:|\n",
      100 * s.target, names.front());
  for (const std::string& name : names) {
    const auto& f = json["policies"][name]["fewest_gpus"];
    const std::string ratio = f.is_null() || base.is_null()
                                  ? "n/a"
                                  : absl::StrFormat("%.2f", f.get<double>() / base.get<double>());
    absl::StrAppend(&md, "| ", name, " | ",
                    f.is_null() ? absl::StrCat("> ", gpus.back()) : absl::StrCat(f.get<int>()),
                    " | ", ratio, " |\n");
  }
  WriteFileAtomic(fs::path(s.out) / "sweep.md", md);
  std::cout << "\n" << md;
  if (s.plots) {
    auto png = bench::RenderSweepPlot(s.out, table, s.target);
    if (!png.ok()) std::cerr << "warning: no plot: " << png.status().message() << "\n";
  }
  std::cout << "results: " << (fs::path(s.out) / "sweep.json").string() << std::endl;
  return 0;
}

}  // namespace

bool SimCli::RunParsed(int* rc) {
  if (!s_->cmd->parsed()) return false;
  if (s_->config.empty() || s_->trace.empty()) {
    *rc = Fail("simulate needs --config FILE and --trace FILE");
    return true;
  }
  *rc = s_->sweep->parsed() ? RunSweep(*s_) : RunSimulate(*s_);
  return true;
}

}  // namespace ballast::server
