#include "server/engine_bench_cli.h"

#include <cstdio>
#include <fstream>
#include <iostream>

#include "absl/strings/numbers.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "engine/gpu_bench.h"
#include "nlohmann/json.hpp"

namespace ballast::server {

struct EngineBenchCli::State {
  engine::GpuEngineBenchOptions o;
  std::string batches = "1,16,64,256";
  std::string mixed;
  std::string out;
  std::string hf_json;
  CLI::App* cmd = nullptr;
  engine::GpuActivationBenchOptions act;
  std::string act_out;
  int act_page_mib = 64;
  CLI::App* act_cmd = nullptr;
};

EngineBenchCli::EngineBenchCli(CLI::App* app) : s_(std::make_unique<State>()) {
  auto* c = app->add_subcommand("bench-engine",
                                "time the CUDA executor (decode ms/step, prefill tokens/s) "
                                "against the HBM roofline and cuBLAS");
  s_->cmd = c;
  auto& o = s_->o;
  c->add_option("--model", o.model_dir, "checkpoint directory (config.json + *.safetensors)")
      ->required();
  c->add_option("--device", o.device)->capture_default_str();
  c->add_option("--batches", s_->batches, "decode batch sizes")->capture_default_str();
  c->add_option("--context", o.context, "KV tokens per decoding sequence")->capture_default_str();
  c->add_option("--context-sigma", o.context_sigma,
                "> 0: contexts drawn log-normal with mean --context and this sigma (seed 1), "
                "clamped to [1, 4 x context], as a server's differ; 0: all equal")
      ->check(CLI::Range(0.0, 3.0))
      ->capture_default_str();
  c->add_flag("--interleave-kv", o.interleave_kv,
              "allocate the decoding sequences' KV one block of each in turn, as a server's "
              "sequences grow together (default: each sequence's blocks in one run)");
  c->add_option("--prefill", o.prefill_tokens, "prompt tokens of the prefill run (0 = skip)")
      ->capture_default_str();
  c->add_option("--prefill-prompts", o.prefill_prompts,
                "the prefill's tokens as this many prompts in one step (as a server's step of "
                "many short prompts)")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  c->add_option("--steps", o.steps, "timed decode steps per batch size")->capture_default_str();
  c->add_option("--warmup", o.warmup)->capture_default_str();
  c->add_option("--block-tokens", o.block_tokens)->capture_default_str();
  c->add_option("--kv-dtype", o.kv_dtype, "auto | bf16 | fp16 | fp8_e4m3")->capture_default_str();
  c->add_option("--quantization", o.quantization, "none | fp8 (linear-layer weights in E4M3)")
      ->capture_default_str();
  c->add_flag("!--no-graphs", o.cuda_graphs, "disable CUDA graphs for decode steps");
  c->add_flag("--deterministic", o.deterministic,
              "batch-invariant kernels (engine.deterministic), to measure their cost");
  c->add_flag("!--no-fold-norms", o.fold_norms,
              "run the RMSNorms between skinny products as their own launches (to measure the "
              "folding)");
  c->add_flag("!--no-fold-rope", o.fold_rope,
              "run RoPE and the KV write as their own launch after a skinny qkv product (to "
              "measure the folding)");
  c->add_option("--skinny-max-m", o.skinny_gemm_max_m,
                "GEMMs with at most this many rows use the skinny kernel (0 = cuBLASLt only)")
      ->capture_default_str();
  c->add_option("--skinny-fp8-max-m", o.skinny_fp8_max_m,
                "FP8 products with at most this many rows read unquantized activations (W8A16; "
                "0 = always quantize)")
      ->capture_default_str();
  c->add_option("--skinny-mma-max-m", o.skinny_mma_max_m,
                "FP8 GEMMs past --skinny-max-m rows and up to this many use the tensor-core "
                "skinny kernel (0 = off; at most 16)")
      ->capture_default_str();
  c->add_flag("--skinny-mma-2byte", o.skinny_mma_2byte,
              "BF16/FP16 GEMMs take the tensor-core skinny kernel too (to measure it)");
  c->add_option(
       "--gemm-tune", o.gemm_tune_candidates,
       "cuBLASLt algorithms timed per GEMM shape and row bucket (0 = the heuristic's first)")
      ->capture_default_str()
      ->check(CLI::NonNegativeNumber);
  c->add_option("--hbm-bytes-per-s", o.hbm_bytes_per_s,
                "HBM bandwidth of the roofline (default: the device's datasheet figure)");
  c->add_option("--interference-batch", o.interference_batch,
                "also time the prefill beside a second copy decoding this batch, at default and "
                "greatest stream priority (0 = skip)")
      ->capture_default_str();
  c->add_option("--interference-foreground", o.interference_foreground,
                "prefill (beside a decoding batch) | decode (batch 1, beside prefills)")
      ->capture_default_str();
  c->add_option("--interference-sms", o.interference_sms,
                "give the interference foreground this many SMs and the background the rest "
                "(CUDA green contexts; 0 = both share every SM)")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str();
  c->add_option("--concurrent-models", o.concurrent_models,
                "also decode every batch size on this many copies at once, one thread each "
                "(aggregate tokens/s; 0 = skip)")
      ->capture_default_str();
  c->add_option("--prefill-runs", o.prefill_runs, "timed prefill runs")->capture_default_str();
  c->add_option("--mixed", s_->mixed,
                "chunk lengths: per decode batch, a step of its decodes plus one chunk of this "
                "many prompt tokens, against each alone (empty = skip)");
  c->add_option("--kv-pool", o.kv_pool, "static | arena (elastic slab arena over CUDA VMM)")
      ->capture_default_str();
  c->add_option("--out", s_->out, "write the JSON result here");
  c->add_option("--hf-json", s_->hf_json,
                "transformers' figures on the same weights (tests/bench/hf_engine_bench.py)");

  auto* a = app->add_subcommand("bench-activation",
                                "time activating a model from its pinned host copy (VMM weight "
                                "pages, parallel chunked copies, executor set-up) against the "
                                "PCIe bound");
  s_->act_cmd = a;
  a->add_option("--config", s_->act.config_path, "a config.json giving the model's shapes")
      ->required();
  a->add_option("--device", s_->act.device)->capture_default_str();
  a->add_option("--runs", s_->act.runs)->capture_default_str();
  a->add_option("--copy-streams", s_->act.copy_streams)->capture_default_str();
  a->add_option("--quantization", s_->act.quantization, "none | fp8 (linear-layer weights in E4M3)")
      ->capture_default_str();
  a->add_option("--page-mib", s_->act_page_mib, "VMM page size the weights are mapped in")
      ->capture_default_str();
  a->add_option("--max-seqs", s_->act.max_seqs,
                "the executor's max_seqs (node.engine.max_seqs): sizes its buffers and the "
                "products warmed at activation; 0: 256 rows")
      ->check(CLI::Range(0, 8192))
      ->capture_default_str();
  a->add_option("--max-batch-tokens", s_->act.max_batch_tokens,
                "the executor's step budget (node.engine.max_batch_tokens); 0: max(256, "
                "--max-seqs)")
      ->check(CLI::Range(0, 65536))
      ->capture_default_str();
  a->add_flag("!--no-warm-products", s_->act.warm_products,
              "skip launching each product shape once at activation (node.engine.warm_products)");
  a->add_option("--out", s_->act_out, "write the JSON result here");
}

EngineBenchCli::~EngineBenchCli() = default;

bool ParsePositiveInts(const std::string& flag, const std::string& text, std::vector<int>* out) {
  out->clear();
  for (absl::string_view b : absl::StrSplit(text, ',', absl::SkipEmpty())) {
    int v = 0;
    if (!absl::SimpleAtoi(b, &v) || v <= 0) {
      std::cerr << "error: " << flag << ": \"" << b << "\" is not a positive integer\n";
      return false;
    }
    out->push_back(v);
  }
  return true;
}

namespace {

// The mixed chunked-prefill rows (engine_bench_mixed.h) as a table.
void PrintMixed(const nlohmann::json& mixed) {
  std::cout << "\n| decode batch | chunk | mixed ms | decodes alone ms | chunk alone ms | "
               "chunk's marginal ms | chunk speed kept |\n"
               "|---:|---:|---:|---:|---:|---:|---:|\n";
  for (const auto& m : mixed) {
    const auto& kept = m["chunk_speed_kept"];
    std::cout << absl::StrFormat(
        "| %d | %d | %.2f | %.2f | %.2f | %.2f | %s |\n", m["batch"].get<int>(),
        m["chunk"].get<int>(), m["mixed_ms"].get<double>(), m["decode_ms"].get<double>(),
        m["chunk_ms"].get<double>(), m["marginal_ms"].get<double>(),
        kept.is_null() ? "-" : absl::StrFormat("%.2f", kept.get<double>()));
  }
}

// `ballast bench-activation`: runs it and prints the result; the exit code.
int RunActivationBench(engine::GpuActivationBenchOptions act, int page_mib,
                       const std::string& out) {
  if (page_mib <= 0 || page_mib % 2 != 0) {
    std::cerr << "error: --page-mib must be a positive multiple of 2\n";
    return 2;
  }
  act.page_bytes = static_cast<size_t>(page_mib) << 20;
  auto r = engine::RunGpuActivationBench(act);
  if (!r.ok()) {
    std::cerr << "error: " << r.status().message() << "\n";
    return 1;
  }
  nlohmann::json j = nlohmann::json::parse(*r);
  if (!out.empty()) std::ofstream(out) << j.dump(2) << "\n";
  std::cout << absl::StrFormat(
      "%s: %.2f GiB of weights, PCIe bound %.0f ms at %.1f GB/s; activation best %.0f ms "
      "(%.2fx the bound); one copy stream %.0f ms\n",
      j["device"].get<std::string>(), j["weight_bytes"].get<double>() / (1 << 30),
      j["pcie_bound_ms"].get<double>(), j["h2d_bytes_per_s"].get<double>() / 1e9,
      j["best_total_ms"].get<double>(), j["ratio_to_bound"].get<double>(),
      j["single_stream_copy_ms"].get<double>());
  for (const auto& run : j["runs"]) {
    std::cout << absl::StrFormat("  map %.1f ms, copy %.1f ms, executor (copy + set-up) %.1f ms\n",
                                 run["map_ms"].get<double>(), run["copy_ms"].get<double>(),
                                 run["executor_ms"].get<double>());
  }
  return 0;
}

// bench-engine's result as tables: decode (beside transformers' figures
// in `hf`, if any), prefill, mixed steps.
void PrintEngineResult(const nlohmann::json& j, const nlohmann::json& hf) {
  std::cout << "device: " << j["device"].get<std::string>() << ", weights "
            << absl::StrFormat("%.2f GiB", j["weight_bytes"].get<double>() / (1 << 30)) << ", load "
            << absl::StrFormat("%.1f s", j["load_s"].get<double>())
            << absl::StrFormat(
                   ", roofline at %.2f TB/s (device-to-device copy measures %.2f TB/s, reads "
                   "alone %.2f TB/s)",
                   j["hbm_bytes_per_s"].get<double>() / 1e12,
                   j["copy_bytes_per_s"].get<double>() / 1e12,
                   j.value("read_bytes_per_s", 0.0) / 1e12)
            << "\n";
  if (j.contains("first_steps_ms")) {
    const auto& f = j["first_steps_ms"];
    std::cout << absl::StrFormat(
        "first steps after activation (8-token prefills): %.1f, %.1f, %.1f ms\n",
        f[0].get<double>(), f[1].get<double>(), f[2].get<double>());
  }
  std::cout << "\n";
  auto hf_decode = [&](int batch) -> double {
    if (!hf.contains("decode")) return 0;
    for (const auto& d : hf["decode"]) {
      if (d["batch"].get<int>() == batch) return d["ms_per_step"].get<double>();
    }
    return 0;
  };
  std::cout << "| decode batch | ms/step | tokens/s | roofline ms | % of roofline | transformers "
               "ms/step | speed-up |\n"
               "|---:|---:|---:|---:|---:|---:|---:|\n";
  for (const auto& d : j["decode"]) {
    const int b = d["batch"].get<int>();
    const double ms = d["ms_per_step"].get<double>(), h = hf_decode(b);
    std::cout << absl::StrFormat(
        "| %d | %.2f | %.0f | %.2f | %.1f%% | %s | %s |\n", b, ms, d["tokens_per_s"].get<double>(),
        d["roofline_ms"].get<double>(), 100 * d["roofline_fraction"].get<double>(),
        h > 0 ? absl::StrFormat("%.2f", h) : "-", h > 0 ? absl::StrFormat("%.2fx", h / ms) : "-");
  }
  if (j.contains("prefill")) {
    const auto& p = j["prefill"];
    std::cout << absl::StrFormat(
        "\nprefill %d tokens in %d prompt(s): %.1f ms, %.0f tokens/s, "
        "%.0f TFLOP/s",
        p["tokens"].get<int>(), p.value("prompts", 1), p["ms"].get<double>(),
        p["tokens_per_s"].get<double>(), p["tflops"].get<double>());
    if (p.contains("fraction_of_gemm_peak")) {
      std::cout << absl::StrFormat(" = %.1f%% of the cuBLASLt 8192^3 GEMM on zeros (%.0f TFLOP/s)",
                                   100 * p["fraction_of_gemm_peak"].get<double>(),
                                   j["gemm_peak_tflops"].get<double>());
    }
    if (p.contains("fraction_of_gemm_peak_random")) {
      std::cout << absl::StrFormat(", %.1f%% of it on random data (%.0f TFLOP/s)",
                                   100 * p["fraction_of_gemm_peak_random"].get<double>(),
                                   j["gemm_peak_random_tflops"].get<double>());
    }
    if (hf.contains("prefill")) {
      const double hms = hf["prefill"]["ms"].get<double>();
      std::cout << absl::StrFormat("; transformers %.1f ms (%.2fx)", hms,
                                   hms / p["ms"].get<double>());
    }
    std::cout << "\n";
  }
  if (j.contains("mixed")) PrintMixed(j["mixed"]);
}

}  // namespace

bool EngineBenchCli::RunParsed(int* rc) {
  if (s_->act_cmd->parsed()) {
    *rc = RunActivationBench(s_->act, s_->act_page_mib, s_->act_out);
    return true;
  }
  if (!s_->cmd->parsed()) return false;
  auto& o = s_->o;
  if (!ParsePositiveInts("--batches", s_->batches, &o.batches) ||
      !ParsePositiveInts("--mixed", s_->mixed, &o.mixed_chunks)) {
    *rc = 2;
    return true;
  }
  auto r = engine::RunGpuEngineBench(o);
  if (!r.ok()) {
    std::cerr << "error: " << r.status().message() << "\n";
    *rc = 1;
    return true;
  }
  nlohmann::json j = nlohmann::json::parse(*r);
  nlohmann::json hf;
  if (!s_->hf_json.empty()) {
    std::ifstream in(s_->hf_json);
    if (!in) {
      std::cerr << "error: cannot read " << s_->hf_json << "\n";
      *rc = 2;
      return true;
    }
    hf = nlohmann::json::parse(in, nullptr, false);
    j["transformers"] = hf;
  }
  if (!s_->out.empty()) std::ofstream(s_->out) << j.dump(2) << "\n";
  PrintEngineResult(j, hf);
  *rc = 0;
  return true;
}

}  // namespace ballast::server
