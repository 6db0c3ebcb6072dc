#include "server/bench_cli.h"

#include "server/bench_commands.h"
#include "server/cli_lists.h"

namespace ballast::server {
namespace {

void AddLengths(CLI::App* c, bench::LengthParams* L) {
  c->add_option("--prompt-mean", L->prompt_mean, "mean prompt tokens")->capture_default_str();
  c->add_option("--output-mean", L->output_mean, "mean output tokens")->capture_default_str();
  c->add_option("--length-scale", L->scale, "multiplies both means (small for CPU runs)")
      ->capture_default_str();
  c->add_option("--prompt-max", L->prompt_max)->capture_default_str();
  c->add_option("--output-max", L->output_max)->capture_default_str();
}

// `trace import`'s flags.
struct ImportFlags {
  std::string format, models;
  bench::ImportOptions options;
  double duration = 0;
  CLI::Option* duration_opt = nullptr;
  CLI::App* cmd = nullptr;
};

void AddImport(CLI::App* trace, ImportFlags* f, std::string* out) {
  CLI::App* c = f->cmd = trace->add_subcommand(
      "import", "convert a production trace (Azure LLM, BurstGPT, Mooncake) into a trace");
  c->add_option("--format", f->format, "azure | burstgpt | mooncake");
  c->add_option("--input,-i", f->options.inputs,
                "trace file (repeatable); azure, mooncake: one service per file, the i-th to the "
                "i-th model; burstgpt: parts of one trace");
  c->add_option("--out,-o", *out, "trace file to write")->capture_default_str();
  c->add_option("--models", f->models,
                "comma-separated catalogue models the services map onto (burstgpt: in order of "
                "first appearance)");
  c->add_option("--start", f->options.start_s, "window start: seconds after the first timestamp")
      ->capture_default_str();
  f->duration_opt =
      c->add_option("--duration", f->duration, "window length in seconds (default: all)");
  c->add_option("--length-scale", f->options.length_scale,
                "multiplies prompt and output lengths (each stays >= 1)")
      ->capture_default_str();
  c->add_option("--time-scale", f->options.time_scale,
                "multiplies arrival offsets (0.5: twice the rate)")
      ->capture_default_str();
  c->add_flag("--by-log-type", f->options.by_log_type,
              "burstgpt: a service per (Model, Log Type), e.g. \"ChatGPT (API log)\"");
}

// `trace import`: the flags CLI11 does not check, then the import.
int RunImport(ImportFlags* f, const std::string& out) {
  auto format = bench::ParseImportFormat(f->format);
  if (!format.ok()) {
    std::cerr << "error: " << format.status().message() << "\n";
    return 2;
  }
  f->options.format = *format;
  f->options.models = SplitList(f->models);
  if (f->duration_opt->count() > 0) f->options.duration_s = f->duration;
  return RunTraceImport(f->options, out);
}

CLI::App* AddShareGpt(CLI::App* trace, bench::ShareGptParams* p, std::string* out,
                      std::string* models) {
  CLI::App* c = trace->add_subcommand(
      "sharegpt", "offline throughput: N requests at t = 0 with ShareGPT-like lengths");
  c->add_option("--out,-o", *out, "trace file to write")->capture_default_str();
  c->add_option("--models", *models, "comma-separated model names (requests go in turn)")
      ->capture_default_str();
  c->add_option("--seed", p->seed)->capture_default_str();
  c->add_option("--requests,-n", p->requests)->capture_default_str()->check(CLI::PositiveNumber);
  c->add_option("--prompt-mean", p->prompt_mean, "log-normal mean before the filter")
      ->capture_default_str();
  c->add_option("--prompt-cv", p->prompt_cv)->capture_default_str();
  c->add_option("--output-mean", p->output_mean, "log-normal mean before the filter")
      ->capture_default_str();
  c->add_option("--output-cv", p->output_cv)->capture_default_str();
  c->add_option("--prompt-max", p->prompt_max)->capture_default_str();
  c->add_option("--total-max", p->total_max, "prompt + output at most")->capture_default_str();
  c->add_option("--min-tokens", p->min_tokens, "prompt and output at least")->capture_default_str();
  c->add_option("--length-scale", p->scale, "multiplies the means and limits (small for CPU)")
      ->capture_default_str();
  return c;
}

}  // namespace

struct BenchCli::State {
  std::string models = "tiny-llama,tiny-qwen2,tiny-mistral";
  std::string out = "trace.jsonl";
  std::string rates = "1";
  std::string scales = "1";
  std::string search;  // compare --search LO,HI
  std::string configs;
  std::string stats_file;
  std::string stats_models;
  bench::ArrivalParams arrivals;
  bench::BurstyParams bursty;
  bench::ChatParams chat;
  bench::AgentParams agents;
  bench::ShareGptParams sharegpt;
  ImportFlags import;
  BenchFlags bench;
  CLI::App *arrivals_cmd, *bursty_cmd, *chat_cmd, *agents_cmd, *sharegpt_cmd, *stats_cmd,
      *bench_cmd, *compare_cmd;
};

BenchCli::BenchCli(CLI::App* app) : s_(std::make_unique<State>()) {
  State& s = *s_;
  auto* trace = app->add_subcommand(
      "trace", "generate or import workload traces (JSONL), or show their statistics");
  trace->require_subcommand(1);
  auto common = [&](CLI::App* c, uint64_t* seed, double* duration) {
    c->add_option("--out,-o", s.out, "trace file to write")->capture_default_str();
    c->add_option("--models", s.models, "comma-separated model names")->capture_default_str();
    c->add_option("--seed", *seed)->capture_default_str();
    c->add_option("--duration", *duration, "seconds of arrivals")->capture_default_str();
  };
  s.arrivals_cmd = trace->add_subcommand("arrivals", "Poisson or Gamma arrivals per model");
  common(s.arrivals_cmd, &s.arrivals.seed, &s.arrivals.duration_s);
  s.arrivals_cmd->add_option("--rates", s.rates,
                             "requests/s per model, comma-separated (one value: all)");
  s.arrivals_cmd->add_option("--process", s.arrivals.process, "poisson | gamma")
      ->capture_default_str();
  s.arrivals_cmd->add_option("--cv", s.arrivals.cv, "Gamma coefficient of variation")
      ->capture_default_str();
  AddLengths(s.arrivals_cmd, &s.arrivals.lengths);

  s.bursty_cmd =
      trace->add_subcommand("bursty", "bursty multi-model traffic (Prism §3 properties)");
  common(s.bursty_cmd, &s.bursty.seed, &s.bursty.duration_s);
  s.bursty_cmd->add_option("--persistent-fraction", s.bursty.persistent_fraction)
      ->capture_default_str();
  s.bursty_cmd->add_option("--persistent-rate", s.bursty.persistent_rate)->capture_default_str();
  s.bursty_cmd->add_option("--burst-rate", s.bursty.burst_rate)->capture_default_str();
  s.bursty_cmd->add_option("--cv", s.bursty.cv, "persistent models' inter-arrival CV")
      ->capture_default_str();
  s.bursty_cmd->add_option("--burst-cv", s.bursty.burst_cv, "inter-arrival CV inside bursts")
      ->capture_default_str();
  s.bursty_cmd->add_option("--on-mean", s.bursty.on_mean_s, "mean burst length (s)")
      ->capture_default_str();
  s.bursty_cmd
      ->add_option("--group-interval", s.bursty.group_interval_s,
                   "mean time between group bursts (s)")
      ->capture_default_str();
  s.bursty_cmd
      ->add_option("--group-fraction", s.bursty.group_fraction,
                   "chance a sporadic model joins a burst")
      ->capture_default_str();
  AddLengths(s.bursty_cmd, &s.bursty.lengths);

  s.chat_cmd = trace->add_subcommand("chat", "multi-turn chat sessions with advisories");
  common(s.chat_cmd, &s.chat.seed, &s.chat.duration_s);
  s.chat_cmd->add_option("--session-rate", s.chat.session_rate, "new sessions/s")
      ->capture_default_str();
  s.chat_cmd->add_option("--turns-mean", s.chat.turns_mean)->capture_default_str();
  s.chat_cmd->add_option("--typing-mean", s.chat.typing_mean_s, "advisory lead (s)")
      ->capture_default_str();
  s.chat_cmd->add_option("--reading-speed", s.chat.reading_tokens_per_s)->capture_default_str();
  s.chat_cmd->add_option("--advise-miss", s.chat.advise_miss)->capture_default_str();
  s.chat_cmd->add_option("--advise-spurious", s.chat.advise_spurious)->capture_default_str();
  AddLengths(s.chat_cmd, &s.chat.lengths);

  s.agents_cmd = trace->add_subcommand("agents", "agent call graphs with next-hop advisories");
  common(s.agents_cmd, &s.agents.seed, &s.agents.duration_s);
  s.agents_cmd->add_option("--workflow-rate", s.agents.workflow_rate)->capture_default_str();
  s.agents_cmd->add_option("--tool-mean", s.agents.tool_mean_s)->capture_default_str();
  AddLengths(s.agents_cmd, &s.agents.lengths);

  s.sharegpt_cmd = AddShareGpt(trace, &s.sharegpt, &s.out, &s.models);

  s.stats_cmd = trace->add_subcommand("stats", "print a trace's statistics");
  s.stats_cmd->add_option("file", s.stats_file)->required();
  s.stats_cmd->add_option("--models", s.stats_models,
                          "the catalogue (comma-separated): idle models count in the active share");

  AddImport(trace, &s.import, &s.out);

  s.bench_cmd = app->add_subcommand("bench", "replay a trace and report SLO attainment");
  s.bench_cmd->require_subcommand(0, 1);
  auto bench_opts = [&](CLI::App* c, bool target) {
    c->add_option("--trace", s.bench.trace, "trace file (JSONL)")->required();
    if (target)
      c->add_option("--target", s.bench.target, "scheduler address")->capture_default_str();
    c->add_option("--rate-scale", s.scales, "comma-separated rate scales")->capture_default_str();
    c->add_option("--slo-scale", s.bench.slo_scale, "multiplies every SLO")->capture_default_str();
    c->add_option("--duration", s.bench.duration_s, "replay only this many seconds of arrivals");
    c->add_option("--out", s.bench.out, "output directory")->capture_default_str();
    c->add_option("--max-inflight", s.bench.max_inflight)->capture_default_str();
    c->add_option("--max-client-lag-ms", s.bench.max_client_lag_ms,
                  "client lag p99 beyond which a run is flagged invalid")
        ->capture_default_str();
    c->add_flag("!--no-plots", s.bench.plots, "skip the gnuplot PNGs");
  };
  s.compare_cmd = s.bench_cmd->add_subcommand(
      "compare", "run `ballast serve` under each config on the same trace");
  bench_opts(s.compare_cmd, false);
  s.compare_cmd->add_option("--configs", s.configs, "comma-separated ballast serve configs")
      ->required();
  s.compare_cmd
      ->add_option("--search", s.search,
                   "LO,HI: instead of --rate-scale, search each config's highest rate scale "
                   "with >= 99% TTFT attainment in [LO, HI] by geometric bisection")
      ->capture_default_str();
  s.compare_cmd->add_option("--search-runs", s.bench.search_runs, "runs per config at most")
      ->capture_default_str();
  s.compare_cmd->add_flag("--warmup", s.bench.warmup,
                          "before each run, send one request to every model of the trace and "
                          "wait for the catalogue to settle (a steady state, not a cold start)");
  // Options of plain `bench` are parsed only when `compare` is absent.
  s.bench_cmd->fallthrough(false);
  s.bench_cmd->add_option("--trace", s.bench.trace, "trace file (JSONL)");
  s.bench_cmd->add_option("--target", s.bench.target, "scheduler address")->capture_default_str();
  s.bench_cmd->add_option("--rate-scale", s.scales, "comma-separated rate scales")
      ->capture_default_str();
  s.bench_cmd->add_option("--slo-scale", s.bench.slo_scale, "multiplies every SLO")
      ->capture_default_str();
  s.bench_cmd->add_option("--duration", s.bench.duration_s,
                          "replay only this many seconds of arrivals");
  s.bench_cmd->add_option("--out", s.bench.out, "output directory")->capture_default_str();
  s.bench_cmd->add_option("--max-inflight", s.bench.max_inflight)->capture_default_str();
  s.bench_cmd
      ->add_option("--max-client-lag-ms", s.bench.max_client_lag_ms,
                   "client lag p99 beyond which a run is flagged invalid")
      ->capture_default_str();
  s.bench_cmd->add_flag("!--no-plots", s.bench.plots, "skip the gnuplot PNGs");
}

BenchCli::~BenchCli() = default;

bool BenchCli::RunParsed(int* rc) {
  State& s = *s_;
  const auto models = SplitList(s.models);
  if (s.arrivals_cmd->parsed()) {
    s.arrivals.models = models;
    if (!ParsePositiveList(s.rates, &s.arrivals.rates)) {
      std::cerr << "error: --rates: expected positive numbers\n";
      *rc = 2;
      return true;
    }
    *rc = RunTraceGenerate(bench::GenerateArrivals(s.arrivals), s.out);
    return true;
  }
  if (s.bursty_cmd->parsed()) {
    s.bursty.models = models;
    *rc = RunTraceGenerate(bench::GenerateBursty(s.bursty), s.out);
    return true;
  }
  if (s.chat_cmd->parsed()) {
    s.chat.models = models;
    *rc = RunTraceGenerate(bench::GenerateChat(s.chat), s.out);
    return true;
  }
  if (s.agents_cmd->parsed()) {
    s.agents.models = models;
    *rc = RunTraceGenerate(bench::GenerateAgents(s.agents), s.out);
    return true;
  }
  if (s.sharegpt_cmd->parsed()) {
    s.sharegpt.models = models;
    auto trace = bench::GenerateShareGpt(s.sharegpt);
    if (!trace.ok()) {
      std::cerr << "error: " << trace.status().message() << "\n";
      *rc = 2;
      return true;
    }
    *rc = RunTraceGenerate(*trace, s.out);
    return true;
  }
  if (s.stats_cmd->parsed()) {
    *rc = RunTraceStats(s.stats_file, SplitList(s.stats_models));
    return true;
  }
  if (s.import.cmd->parsed()) {
    *rc = RunImport(&s.import, s.out);
    return true;
  }
  if (s.bench_cmd->parsed()) {
    if (!ParsePositiveList(s.scales, &s.bench.rate_scales)) {
      std::cerr << "error: --rate-scale: expected positive numbers\n";
      *rc = 2;
      return true;
    }
    if (!s.search.empty() &&
        (!ParsePositiveList(s.search, &s.bench.search) || s.bench.search.size() != 2)) {
      std::cerr << "error: --search: expected LO,HI (two positive rate scales)\n";
      *rc = 2;
      return true;
    }
    if (s.compare_cmd->parsed()) {
      s.bench.configs = SplitList(s.configs);
      *rc = RunBenchCompare(s.bench);
    } else if (s.bench.trace.empty()) {
      std::cerr << "error: bench needs --trace FILE\n";
      *rc = 2;
    } else {
      *rc = RunBench(s.bench);
    }
    return true;
  }
  return false;
}

}  // namespace ballast::server
