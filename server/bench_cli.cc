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

// Where a trace generator writes: the trace file and the models.
struct TraceOut {
  std::string* out;
  std::string* models;
};

// The options every generator shares: output, models, seed, duration.
void AddCommon(CLI::App* c, const TraceOut& o, uint64_t* seed, double* duration) {
  c->add_option("--out,-o", *o.out, "trace file to write")->capture_default_str();
  c->add_option("--models", *o.models, "comma-separated model names")->capture_default_str();
  c->add_option("--seed", *seed)->capture_default_str();
  c->add_option("--duration", *duration, "seconds of arrivals")->capture_default_str();
}

// `trace arrivals`: Poisson or Gamma arrivals per model.
CLI::App* AddArrivals(CLI::App* trace, const TraceOut& o, bench::ArrivalParams* p,
                      std::string* rates) {
  CLI::App* c = trace->add_subcommand("arrivals", "Poisson or Gamma arrivals per model");
  AddCommon(c, o, &p->seed, &p->duration_s);
  c->add_option("--rates", *rates, "requests/s per model, comma-separated (one value: all)");
  c->add_option("--process", p->process, "poisson | gamma")->capture_default_str();
  c->add_option("--cv", p->cv, "Gamma coefficient of variation")->capture_default_str();
  AddLengths(c, &p->lengths);
  return c;
}

// `trace bursty`: bursty multi-model traffic.
CLI::App* AddBursty(CLI::App* trace, const TraceOut& o, bench::BurstyParams* p) {
  CLI::App* c = trace->add_subcommand("bursty", "bursty multi-model traffic (Prism §3 properties)");
  AddCommon(c, o, &p->seed, &p->duration_s);
  c->add_option("--persistent-fraction", p->persistent_fraction)->capture_default_str();
  c->add_option("--persistent-rate", p->persistent_rate)->capture_default_str();
  c->add_option("--burst-rate", p->burst_rate)->capture_default_str();
  c->add_option("--cv", p->cv, "persistent models' inter-arrival CV")->capture_default_str();
  c->add_option("--burst-cv", p->burst_cv, "inter-arrival CV inside bursts")->capture_default_str();
  c->add_option("--on-mean", p->on_mean_s, "mean burst length (s)")->capture_default_str();
  c->add_option("--group-interval", p->group_interval_s, "mean time between group bursts (s)")
      ->capture_default_str();
  c->add_option("--group-fraction", p->group_fraction, "chance a sporadic model joins a burst")
      ->capture_default_str();
  AddLengths(c, &p->lengths);
  return c;
}

// `trace chat`: multi-turn chat sessions with advisories.
CLI::App* AddChat(CLI::App* trace, const TraceOut& o, bench::ChatParams* p) {
  CLI::App* c = trace->add_subcommand("chat", "multi-turn chat sessions with advisories");
  AddCommon(c, o, &p->seed, &p->duration_s);
  c->add_option("--session-rate", p->session_rate, "new sessions/s")->capture_default_str();
  c->add_option("--turns-mean", p->turns_mean)->capture_default_str();
  c->add_option("--typing-mean", p->typing_mean_s, "advisory lead (s)")->capture_default_str();
  c->add_option("--reading-speed", p->reading_tokens_per_s)->capture_default_str();
  c->add_option("--advise-miss", p->advise_miss)->capture_default_str();
  c->add_option("--advise-spurious", p->advise_spurious)->capture_default_str();
  AddLengths(c, &p->lengths);
  return c;
}

// `trace agents`: agent call graphs with next-hop advisories.
CLI::App* AddAgents(CLI::App* trace, const TraceOut& o, bench::AgentParams* p) {
  CLI::App* c = trace->add_subcommand("agents", "agent call graphs with next-hop advisories");
  AddCommon(c, o, &p->seed, &p->duration_s);
  c->add_option("--workflow-rate", p->workflow_rate)->capture_default_str();
  c->add_option("--tool-mean", p->tool_mean_s)->capture_default_str();
  AddLengths(c, &p->lengths);
  return c;
}

// `trace stats`: a trace's statistics.
CLI::App* AddStats(CLI::App* trace, std::string* file, std::string* models) {
  CLI::App* c = trace->add_subcommand("stats", "print a trace's statistics");
  c->add_option("file", *file)->required();
  c->add_option("--models", *models,
                "the catalogue (comma-separated): idle models count in the active share");
  return c;
}

// The replay options of `bench compare` (`target`: also --target).
void AddReplayOptions(CLI::App* c, BenchFlags* b, std::string* scales, bool target) {
  c->add_option("--trace", b->trace, "trace file (JSONL)")->required();
  if (target) c->add_option("--target", b->target, "scheduler address")->capture_default_str();
  c->add_option("--rate-scale", *scales, "comma-separated rate scales")->capture_default_str();
  c->add_option("--slo-scale", b->slo_scale, "multiplies every SLO")->capture_default_str();
  c->add_option("--duration", b->duration_s, "replay only this many seconds of arrivals");
  c->add_option("--out", b->out, "output directory")->capture_default_str();
  c->add_option("--max-inflight", b->max_inflight)->capture_default_str();
  c->add_option("--max-client-lag-ms", b->max_client_lag_ms,
                "client lag p99 beyond which a run is flagged invalid")
      ->capture_default_str();
  c->add_flag("!--no-plots", b->plots, "skip the gnuplot PNGs");
}

// `bench compare`: `ballast serve` under each config on one trace.
CLI::App* AddCompare(CLI::App* bench_cmd, BenchFlags* b, std::string* scales, std::string* configs,
                     std::string* search) {
  CLI::App* c = bench_cmd->add_subcommand(
      "compare", "run `ballast serve` under each config on the same trace");
  AddReplayOptions(c, b, scales, false);
  c->add_option("--configs", *configs, "comma-separated ballast serve configs")->required();
  c->add_option("--search", *search,
                "LO,HI: instead of --rate-scale, search each config's highest rate scale "
                "with >= 99% TTFT attainment in [LO, HI] by geometric bisection")
      ->capture_default_str();
  c->add_option("--search-runs", b->search_runs, "runs per config at most")->capture_default_str();
  c->add_flag("--warmup", b->warmup,
              "before each run, send one request to every model of the trace and "
              "wait for the catalogue to settle (a steady state, not a cold start)");
  return c;
}

// Plain `bench`'s own options (a replay against --target).
void AddPlainBenchOptions(CLI::App* bench_cmd, BenchFlags* b, std::string* scales) {
  // Options of plain `bench` are parsed only when `compare` is absent.
  bench_cmd->fallthrough(false);
  bench_cmd->add_option("--trace", b->trace, "trace file (JSONL)");
  bench_cmd->add_option("--target", b->target, "scheduler address")->capture_default_str();
  bench_cmd->add_option("--rate-scale", *scales, "comma-separated rate scales")
      ->capture_default_str();
  bench_cmd->add_option("--slo-scale", b->slo_scale, "multiplies every SLO")->capture_default_str();
  bench_cmd->add_option("--duration", b->duration_s, "replay only this many seconds of arrivals");
  bench_cmd->add_option("--out", b->out, "output directory")->capture_default_str();
  bench_cmd->add_option("--max-inflight", b->max_inflight)->capture_default_str();
  bench_cmd
      ->add_option("--max-client-lag-ms", b->max_client_lag_ms,
                   "client lag p99 beyond which a run is flagged invalid")
      ->capture_default_str();
  bench_cmd->add_flag("!--no-plots", b->plots, "skip the gnuplot PNGs");
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
  const TraceOut out{&s.out, &s.models};
  s.arrivals_cmd = AddArrivals(trace, out, &s.arrivals, &s.rates);
  s.bursty_cmd = AddBursty(trace, out, &s.bursty);
  s.chat_cmd = AddChat(trace, out, &s.chat);
  s.agents_cmd = AddAgents(trace, out, &s.agents);
  s.sharegpt_cmd = AddShareGpt(trace, &s.sharegpt, &s.out, &s.models);
  s.stats_cmd = AddStats(trace, &s.stats_file, &s.stats_models);
  AddImport(trace, &s.import, &s.out);

  s.bench_cmd = app->add_subcommand("bench", "replay a trace and report SLO attainment");
  s.bench_cmd->require_subcommand(0, 1);
  s.compare_cmd = AddCompare(s.bench_cmd, &s.bench, &s.scales, &s.configs, &s.search);
  AddPlainBenchOptions(s.bench_cmd, &s.bench, &s.scales);
}

BenchCli::~BenchCli() = default;

bool BenchCli::RunParsed(int* rc) {
  State& s = *s_;
  if (RunTraceParsed(rc)) return true;
  if (s.stats_cmd->parsed()) {
    *rc = RunTraceStats(s.stats_file, SplitList(s.stats_models));
    return true;
  }
  if (s.import.cmd->parsed()) {
    *rc = RunImport(&s.import, s.out);
    return true;
  }
  if (s.bench_cmd->parsed()) {
    *rc = RunBenchParsed();
    return true;
  }
  return false;
}

bool BenchCli::RunTraceParsed(int* rc) {
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
  return false;
}

int BenchCli::RunBenchParsed() {
  State& s = *s_;
  if (!ParsePositiveList(s.scales, &s.bench.rate_scales)) {
    std::cerr << "error: --rate-scale: expected positive numbers\n";
    return 2;
  }
  if (!s.search.empty() &&
      (!ParsePositiveList(s.search, &s.bench.search) || s.bench.search.size() != 2)) {
    std::cerr << "error: --search: expected LO,HI (two positive rate scales)\n";
    return 2;
  }
  if (s.compare_cmd->parsed()) {
    s.bench.configs = SplitList(s.configs);
    return RunBenchCompare(s.bench);
  }
  if (s.bench.trace.empty()) {
    std::cerr << "error: bench needs --trace FILE\n";
    return 2;
  }
  return RunBench(s.bench);
}

}  // namespace ballast::server
