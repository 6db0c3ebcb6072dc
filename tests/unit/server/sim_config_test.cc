// `ballast simulate`'s config file: the committed examples parse, copies
// expand, and mistakes are reported with the file and the key.
#include "server/sim_config.h"

#include <gtest/gtest.h>

#include "node_manager/device_worker.h"

namespace ballast::server {
namespace {

const std::string kDir = std::string(BALLAST_SOURCE_DIR) + "/configs/sim/";

TEST(SimConfigTest, CommittedExamplesParse) {
  for (const char* name : {"small.yaml", "prism-58.yaml", "cluster-1000.yaml",
                           "cluster-1000-5000.yaml", "validate-h200.yaml", "chat-tiers.yaml",
                           "remap.yaml", "offline-h200.yaml", "remap-validate-h200.yaml"}) {
    auto f = ReadSimConfig(kDir + name);
    ASSERT_TRUE(f.ok()) << name << ": " << f.status();
    EXPECT_EQ(f->calibration_path, kDir + "calibration-h200.json") << name;
  }
  for (const char* name : {"validate-h100.yaml", "offline-h100.yaml"}) {
    auto f = ReadSimConfig(kDir + name);
    ASSERT_TRUE(f.ok()) << name << ": " << f.status();
    EXPECT_EQ(f->calibration_path, kDir + "calibration-h100.json") << name;
  }
  // The H100's rolling validation: its own overlap share (session 62).
  auto h100 = ReadSimConfig(kDir + "validate-h100.yaml");
  ASSERT_TRUE(h100.ok());
  EXPECT_TRUE(h100->variants.at("rolling").rolling_steps);
  EXPECT_EQ(h100->variants.at("rolling").rolling_overlap_share, 0.5);
  EXPECT_EQ(h100->variants.at("rolling").step_host_s, 27.3e-6);
  auto offline = ReadSimConfig(kDir + "offline-h100.yaml");
  ASSERT_TRUE(offline.ok());
  EXPECT_EQ(offline->config.cluster.gpu_memory_bytes, 79LL << 30);  // an 80 GB card's free memory
  // The daemon's remapping validation: remapping off and on, as the
  // two sim-validate.sh runs (REMAP=false|true).
  auto remap = ReadSimConfig(kDir + "remap-validate-h200.yaml");
  ASSERT_TRUE(remap.ok()) << remap.status();
  EXPECT_FALSE(remap->variants.at("off").remap.enabled);
  EXPECT_TRUE(remap->variants.at("remap").remap.enabled);
  EXPECT_EQ(remap->config.cluster.gpu_memory_bytes, 72LL << 30);  // MEMORY_MIB 73728
  // KV held block by block, as the daemon (node.engine.block_tokens 16).
  EXPECT_TRUE(remap->variants.at("off").kv_paged);
  EXPECT_EQ(remap->variants.at("off").kv_block_tokens, 16);
  EXPECT_FALSE(remap->variants.at("whole").kv_paged);
  EXPECT_TRUE(remap->variants.at("off").charge_workspace);
  // The sharing rule refitted to the daemon's 8B runs, a skinny decode
  // step's weight as measured on the card.
  EXPECT_EQ(remap->variants.at("off").rolling_share_exponent, 0.55);
  EXPECT_EQ(remap->variants.at("remap").rolling_overlap_share, 0.3);
  EXPECT_EQ(remap->variants.at("remap").rolling_skinny_weight, 2);
  EXPECT_EQ(remap->variants.at("remap").rolling_skinny_rows, 2);
  EXPECT_EQ(remap->variants.at("remap").rolling_cross_weight, 1);
  // The daemon's KV room: whole 64 MiB pages, the engines' context buffers.
  EXPECT_EQ(remap->variants.at("off").page_mib, 64);
  EXPECT_EQ(remap->variants.at("off").max_context, 4096);
  auto prism = ReadSimConfig(kDir + "prism-58.yaml");
  ASSERT_TRUE(prism.ok());
  EXPECT_EQ(prism->config.models.size(), 58u);  // Prism's Table 3
  EXPECT_EQ(prism->config.cluster.gpu_memory_bytes, 80LL << 30);
  EXPECT_TRUE(prism->variants.at("static").fixed());
  EXPECT_TRUE(prism->variants.at("muxserve-like").fixed());
  EXPECT_FALSE(prism->variants.at("ballast").fixed());
  EXPECT_EQ(prism->variants.at("ballast-budget").step_budget_headroom, 1.0);
  EXPECT_EQ(prism->config.models.back().tp, 4);  // x70b-1, as Prism runs it
  EXPECT_EQ(prism->variants.at("muxserve-like").arbitration,
            node_manager::ArbitrationPolicy::kFcfs);
  auto chat = ReadSimConfig(kDir + "chat-tiers.yaml");
  ASSERT_TRUE(chat.ok());
  EXPECT_EQ(chat->config.policy.session_kv, sim::SessionKv::kTiers);
  EXPECT_EQ(chat->variants.at("recompute").session_kv, sim::SessionKv::kRecompute);
  EXPECT_EQ(chat->variants.at("device").session_kv, sim::SessionKv::kDevice);
  auto big = ReadSimConfig(kDir + "cluster-1000.yaml");
  ASSERT_TRUE(big.ok());
  EXPECT_EQ(big->config.models.size(), 2000u);
  EXPECT_EQ(big->config.cluster.nodes * big->config.cluster.gpus_per_node, 1000);
  auto biggest = ReadSimConfig(kDir + "cluster-1000-5000.yaml");
  ASSERT_TRUE(biggest.ok());
  EXPECT_EQ(biggest->config.models.size(), 5000u);  // the issue's largest catalogue
}

TEST(SimConfigTest, ModelsTakeNamedOrExplicitShapesAndDtypes) {
  auto f = ParseSimConfig(R"(
calibration: c.json
models:
  - {name: a, shape: llama-8b, weight_dtype: fp8, kv_dtype: fp8, copies: 2}
  - {name: b, shape: {layers: 2, hidden: 64, heads: 4, kv_heads: 2, intermediate: 128, vocab: 100}}
)",
                          "/x/s.yaml");
  ASSERT_TRUE(f.ok()) << f.status();
  ASSERT_EQ(f->config.models.size(), 3u);
  EXPECT_EQ(f->config.models[0].name, "a-0");
  EXPECT_EQ(f->config.models[1].name, "a-1");
  EXPECT_EQ(f->config.models[0].shape.weight_dtype_bytes, 1);
  EXPECT_EQ(f->config.models[0].shape.kv_bytes_per_token(), 64 * 1024);
  EXPECT_EQ(f->config.models[2].shape.head_dim, 16);
  EXPECT_EQ(f->calibration_path, "/x/c.json");
}

TEST(SimConfigTest, ErrorsNameTheFileAndTheKey) {
  const std::pair<const char*, const char*> cases[] = {
      {"models: [{name: a, shape: llama-1b}]", "calibration"},
      {"calibration: c.json\nmodels: [{name: a, shape: gpt-9}]", "models[0].shape"},
      {"calibration: c.json\nmodels: [{name: a, shape: llama-1b, kv_dtype: int4}]",
       "models[0].kv_dtype"},
      {"calibration: c.json\npolicy: {placement: random}\nmodels: [{name: a, shape: llama-1b}]",
       "policy.placement"},
      {"calibration: c.json\npolicy: {arbitration: lifo}\nmodels: [{name: a, shape: llama-1b}]",
       "policy.arbitration"},
      {"calibration: c.json\npolicies: {x: {activation: sometimes}}\nmodels: [{name: a, shape: "
       "llama-1b}]",
       "policies.x.activation"},
      {"calibration: c.json\ncluster: {nodes: 0}\nmodels: [{name: a, shape: llama-1b}]", "cluster"},
      {"calibration: c.json\nmodels: [{name: a, shape: llama-1b}, {name: a, shape: llama-3b}]",
       "appears twice"},
      {"calibration: c.json\nmodels: [{name: a, shape: llama-1b, colour: red}]",
       "models[0].colour"},
      {"calibration: c.json\nmodels: []", "models"},
      {"calibration: c.json\ndrain_s: -1\nmodels: [{name: a, shape: llama-1b}]", "drain_s"},
      {"calibration: c.json\npolicy: {kv_pressure_free_fraction: 2}\nmodels: [{name: a, shape: "
       "llama-1b}]",
       "policy.kv_pressure_free_fraction"},
      {"calibration: c.json\ncluster: {gpus: -3}\nmodels: [{name: a, shape: llama-1b}]", "cluster"},
      {"- just\n- a list", "(top level)"},
      {"calibration: c.json\npolicy: {session_kv: ssd}\nmodels: [{name: a, shape: llama-1b}]",
       "policy.session_kv"},
      {"calibration: c.json\ncluster: {dram_gib: -1}\nmodels: [{name: a, shape: llama-1b}]",
       "cluster.dram_gib"},
      {"calibration: c.json\ncluster: {ssd_gib: -2}\nmodels: [{name: a, shape: llama-1b}]",
       "cluster.ssd_gib"},
      {"calibration: c.json\npolicy: {remap: {max_fraction: 1}}\nmodels: [{name: a, shape: "
       "llama-1b}]",
       "policy.remap.max_fraction"},
      {"calibration: c.json\npolicy: {remap: {revert_after_s: -1}}\nmodels: [{name: a, shape: "
       "llama-1b}]",
       "policy.remap.revert_after_s"},
      {"calibration: c.json\npolicy: {remap: {enabled: maybe}}\nmodels: [{name: a, shape: "
       "llama-1b}]",
       "policy.remap.enabled"},
      {"calibration: c.json\npolicy: {remap: {revert_after_ms: 5}}\nmodels: [{name: a, shape: "
       "llama-1b}]",
       "policy.remap.revert_after_ms"},
      {"calibration: c.json\npolicy: {remap: on}\nmodels: [{name: a, shape: llama-1b}]",
       "policy.remap"},
      {"calibration: c.json\npolicies: {x: {remap: {max_fraction: 0}}}\nmodels: [{name: a, shape: "
       "llama-1b}]",
       "policies.x.remap.max_fraction"},
  };
  for (const auto& [yaml, key] : cases) {
    auto f = ParseSimConfig(yaml, "s.yaml");
    ASSERT_FALSE(f.ok()) << yaml;
    EXPECT_NE(f.status().message().find("s.yaml"), std::string::npos) << f.status();
    EXPECT_NE(f.status().message().find(key), std::string::npos) << f.status();
  }
  EXPECT_EQ(ReadSimConfig("/nonexistent.yaml").status().code(), absl::StatusCode::kNotFound);
}

TEST(SimConfigTest, GpusSetsTheNodeCount) {
  auto f = ParseSimConfig(
      "calibration: c.json\ncluster: {gpus_per_node: 8, gpus: 20}\nmodels: [{name: a, shape: "
      "llama-1b}]",
      "s.yaml");
  ASSERT_TRUE(f.ok()) << f.status();
  EXPECT_EQ(f->config.cluster.nodes, 3);  // 8 + 8 + 4
  EXPECT_EQ(f->config.cluster.gpus, 20);
}

TEST(SimConfigTest, SessionTiersHaveDefaultsAndKeys) {
  const std::string base = "calibration: c.json\nmodels: [{name: a, shape: llama-1b}]\n";
  auto dflt = ParseSimConfig(base, "s.yaml");
  ASSERT_TRUE(dflt.ok()) << dflt.status();
  EXPECT_EQ(dflt->config.policy.session_kv, sim::SessionKv::kTiers);
  EXPECT_EQ(dflt->config.cluster.dram_bytes, 4LL << 30);
  EXPECT_EQ(dflt->config.cluster.ssd_bytes, 64LL << 30);
  auto set = ParseSimConfig(
      base + "cluster: {dram_gib: 0.5, ssd_gib: 0}\npolicy: {session_kv: recompute}\n", "s.yaml");
  ASSERT_TRUE(set.ok()) << set.status();
  EXPECT_EQ(set->config.cluster.dram_bytes, 512LL << 20);
  EXPECT_EQ(set->config.cluster.ssd_bytes, 0);
  EXPECT_EQ(set->config.policy.session_kv, sim::SessionKv::kRecompute);
  for (sim::SessionKv k :
       {sim::SessionKv::kTiers, sim::SessionKv::kDevice, sim::SessionKv::kRecompute}) {
    EXPECT_EQ(sim::ParseSessionKv(sim::SessionKvName(k)), k);
  }
  EXPECT_FALSE(sim::ParseSessionKv("ssd").has_value());
}

// Ahead steps (rolling) default to the node's setting and can be turned
// off per variant.
TEST(SimConfigTest, AheadStepsFollowTheNodesDefault) {
  const std::string base = "calibration: c.json\nmodels: [{name: a, shape: llama-1b}]\n";
  auto dflt = ParseSimConfig(base, "s.yaml");
  ASSERT_TRUE(dflt.ok()) << dflt.status();
  EXPECT_EQ(dflt->config.policy.ahead_steps, node_manager::DeviceArbitrationOptions{}.ahead_steps);
  auto set = ParseSimConfig(base + "policies: {behind: {ahead_steps: false}}\n", "s.yaml");
  ASSERT_TRUE(set.ok()) << set.status();
  EXPECT_TRUE(set->config.policy.ahead_steps);
  EXPECT_FALSE(set->variants.at("behind").ahead_steps);
  auto bad = ParseSimConfig(base + "policy: {ahead_steps: 3}\n", "s.yaml");
  EXPECT_FALSE(bad.ok());
}

// The shares of the measured concurrent overlap, rolling (0.5 by default)
// and lockstep (0: only k0 overlaps, as the H100 measured): set per
// variant, and outside [0, 1] an error naming the key and the file.
TEST(SimConfigTest, OverlapSharesAreReadAndChecked) {
  const std::string base = "calibration: c.json\nmodels: [{name: a, shape: llama-1b}]\n";
  struct Share {
    std::string key;
    double sim::SimPolicy::*field;
    double dflt;
  };
  for (const Share& sh :
       {Share{"rolling_overlap_share", &sim::SimPolicy::rolling_overlap_share, 0.3},
        Share{"lockstep_overlap_share", &sim::SimPolicy::lockstep_overlap_share, 0},
        Share{"rolling_cross_weight", &sim::SimPolicy::rolling_cross_weight, 1}}) {
    SCOPED_TRACE(sh.key);
    auto dflt = ParseSimConfig(base, "s.yaml");
    ASSERT_TRUE(dflt.ok()) << dflt.status();
    EXPECT_EQ(dflt->config.policy.*sh.field, sh.dflt);
    auto set = ParseSimConfig(base + "policies: {v: {" + sh.key + ": 0.75}}\n", "s.yaml");
    ASSERT_TRUE(set.ok()) << set.status();
    EXPECT_EQ(set->variants.at("v").*sh.field, 0.75);
    for (const char* bad_value : {"1.5", "-0.1"}) {
      auto bad = ParseSimConfig(base + "policy: {" + sh.key + ": " + bad_value + "}\n", "s.yaml");
      ASSERT_FALSE(bad.ok()) << bad_value;
      EXPECT_NE(bad.status().message().find(sh.key), std::string::npos);
      EXPECT_NE(bad.status().message().find("s.yaml"), std::string::npos);
    }
  }
}

// A skinny decode step's weight (rolling_skinny_weight, 1 by default, in
// (0, 100]) and its rows (rolling_skinny_rows, 2, at least 0): read per
// variant; out of range, an error naming the key and the file.
TEST(SimConfigTest, SkinnyStepsWeightIsReadAndChecked) {
  const std::string base = "calibration: c.json\nmodels: [{name: a, shape: llama-1b}]\n";
  auto dflt = ParseSimConfig(base, "s.yaml");
  ASSERT_TRUE(dflt.ok()) << dflt.status();
  EXPECT_EQ(dflt->config.policy.rolling_skinny_weight, 1);
  EXPECT_EQ(dflt->config.policy.rolling_skinny_rows, 2);
  auto set = ParseSimConfig(
      base + "policies: {v: {rolling_skinny_weight: 2.5, rolling_skinny_rows: 4}}\n", "s.yaml");
  ASSERT_TRUE(set.ok()) << set.status();
  EXPECT_EQ(set->variants.at("v").rolling_skinny_weight, 2.5);
  EXPECT_EQ(set->variants.at("v").rolling_skinny_rows, 4);
  for (const char* bad_value :
       {"rolling_skinny_weight: 0", "rolling_skinny_weight: 101", "rolling_skinny_rows: -1"}) {
    auto bad = ParseSimConfig(base + "policy: {" + bad_value + "}\n", "s.yaml");
    ASSERT_FALSE(bad.ok()) << bad_value;
    const std::string key = std::string(bad_value).substr(0, std::string(bad_value).find(':'));
    EXPECT_NE(bad.status().message().find(key), std::string::npos) << bad.status();
    EXPECT_NE(bad.status().message().find("s.yaml"), std::string::npos);
  }
}

// The request path outside the engine: 0 by default; a negative or
// absurd value is an error naming the key and the file.
TEST(SimConfigTest, RequestPathIsReadAndChecked) {
  const std::string base = "calibration: c.json\nmodels: [{name: a, shape: llama-1b}]\n";
  auto dflt = ParseSimConfig(base, "s.yaml");
  ASSERT_TRUE(dflt.ok()) << dflt.status();
  EXPECT_EQ(dflt->config.policy.request_path_s, 0);
  auto set = ParseSimConfig(base + "policies: {real: {request_path_s: 0.002}}\n", "s.yaml");
  ASSERT_TRUE(set.ok()) << set.status();
  EXPECT_EQ(set->variants.at("real").request_path_s, 0.002);
  auto bad = ParseSimConfig(base + "policy: {request_path_s: -1}\n", "s.yaml");
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("request_path_s"), std::string::npos);
  EXPECT_NE(bad.status().message().find("s.yaml"), std::string::npos);
}

// KV held whole by default; kv_paged and its block size are read, and a
// block of no tokens is an error naming the key and the file.
TEST(SimConfigTest, PagedKvIsReadAndChecked) {
  const std::string base = "calibration: c.json\nmodels: [{name: a, shape: llama-1b}]\n";
  auto dflt = ParseSimConfig(base, "s.yaml");
  ASSERT_TRUE(dflt.ok()) << dflt.status();
  EXPECT_FALSE(dflt->config.policy.kv_paged);
  EXPECT_EQ(dflt->config.policy.kv_block_tokens, 16);
  auto set =
      ParseSimConfig(base + "policies: {p: {kv_paged: true, kv_block_tokens: 32}}\n", "s.yaml");
  ASSERT_TRUE(set.ok()) << set.status();
  EXPECT_TRUE(set->variants.at("p").kv_paged);
  EXPECT_EQ(set->variants.at("p").kv_block_tokens, 32);
  auto bad = ParseSimConfig(base + "policy: {kv_block_tokens: 0}\n", "s.yaml");
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("kv_block_tokens"), std::string::npos);
  EXPECT_NE(bad.status().message().find("s.yaml"), std::string::npos);
  // The daemon's KV room: pages and the engines' context buffers.
  EXPECT_EQ(dflt->config.policy.page_mib, 0);
  EXPECT_EQ(dflt->config.policy.max_context, 0);
  EXPECT_EQ(dflt->config.policy.gpu_sms, 132);
  auto room =
      ParseSimConfig(base + "policy: {page_mib: 64, max_context: 4096, gpu_sms: 114}\n", "s.yaml");
  ASSERT_TRUE(room.ok()) << room.status();
  EXPECT_EQ(room->config.policy.page_mib, 64);
  EXPECT_EQ(room->config.policy.max_context, 4096);
  EXPECT_EQ(room->config.policy.gpu_sms, 114);
  for (const char* key : {"page_mib: -1", "max_context: -5", "gpu_sms: 0"}) {
    auto b = ParseSimConfig(base + "policy: {" + key + "}\n", "s.yaml");
    ASSERT_FALSE(b.ok()) << key;
    EXPECT_NE(b.status().message().find(std::string(key).substr(0, std::string(key).find(':'))),
              std::string::npos)
        << b.status();
  }
}

TEST(SimConfigTest, RemapHasTheDaemonsDefaultsAndKeys) {
  const std::string base = "calibration: c.json\nmodels: [{name: a, shape: llama-1b}]\n";
  auto dflt = ParseSimConfig(base, "s.yaml");
  ASSERT_TRUE(dflt.ok()) << dflt.status();
  const node_manager::RemapOptions daemon;
  const sim::SimRemap& r = dflt->config.policy.remap;
  EXPECT_EQ(r.enabled, daemon.enabled);
  EXPECT_FALSE(r.enabled);
  EXPECT_EQ(r.max_fraction, daemon.max_fraction);
  EXPECT_EQ(r.respect_timing, daemon.respect_timing);
  EXPECT_EQ(r.revert_after_s, absl::ToDoubleSeconds(daemon.revert_after));
  auto set = ParseSimConfig(base +
                                "policy: {remap: {enabled: true, max_fraction: 0.25, "
                                "respect_timing: false, revert_after_s: 3}}\n"
                                "policies: {quick: {remap: {revert_after_s: 0}}}\n",
                            "s.yaml");
  ASSERT_TRUE(set.ok()) << set.status();
  const sim::SimRemap& s = set->config.policy.remap;
  EXPECT_TRUE(s.enabled);
  EXPECT_EQ(s.max_fraction, 0.25);
  EXPECT_FALSE(s.respect_timing);
  EXPECT_EQ(s.revert_after_s, 3);
  // A variant overrides only the keys it names.
  const sim::SimRemap& q = set->variants.at("quick").remap;
  EXPECT_TRUE(q.enabled);
  EXPECT_EQ(q.max_fraction, 0.25);
  EXPECT_EQ(q.revert_after_s, 0);
  auto example = ReadSimConfig(kDir + "remap.yaml");
  ASSERT_TRUE(example.ok()) << example.status();
  EXPECT_FALSE(example->variants.at("off").remap.enabled);
  EXPECT_TRUE(example->variants.at("remap").remap.respect_timing);
  EXPECT_FALSE(example->variants.at("forced").remap.respect_timing);
}

}  // namespace
}  // namespace ballast::server
