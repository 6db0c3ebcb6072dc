#include "bench/trace.h"

#include <fstream>
#include <set>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "nlohmann/json.hpp"

namespace ballast::bench {

using nlohmann::json;

std::string ToJsonLine(const TraceRecord& r) {
  json j;
  j["type"] = r.is_request() ? "request" : "advise";
  j["id"] = r.id;
  j["model"] = r.model;
  j["arrival_s"] = r.arrival_s;
  if (!r.after.empty()) {
    j["after"] = r.after;
    j["delay_s"] = r.delay_s;
  }
  if (!r.session.empty()) {
    j["session"] = r.session;
    j["turn"] = r.turn;
  }
  if (r.is_request()) {
    if (!r.prompt.empty())
      j["prompt"] = r.prompt;
    else
      j["prompt_tokens"] = r.prompt_tokens;
    j["output_tokens"] = r.output_tokens;
    if (r.ttft_ms) j["ttft_ms"] = r.ttft_ms;
    if (r.tpot_ms) j["tpot_ms"] = r.tpot_ms;
    if (r.priority) j["priority"] = r.priority;
  } else {
    j["for"] = r.for_request;
    if (r.expected_arrival_s > 0) j["expected_arrival_s"] = r.expected_arrival_s;
    if (!r.next_hops.empty()) j["next_hops"] = r.next_hops;
  }
  return j.dump();
}

absl::Status WriteTrace(const std::string& path, const std::vector<TraceRecord>& records) {
  std::ofstream out(path, std::ios::trunc);
  if (!out) return absl::PermissionDeniedError(absl::StrCat("cannot write ", path));
  for (const auto& r : records) out << ToJsonLine(r) << "\n";
  out.close();
  if (!out) return absl::DataLossError(absl::StrCat("short write to ", path));
  return absl::OkStatus();
}

absl::StatusOr<std::vector<TraceRecord>> ParseTrace(const std::string& text,
                                                    const std::string& origin) {
  std::vector<TraceRecord> out;
  std::set<std::string> ids;
  std::istringstream in(text);
  std::string line;
  int lineno = 0;
  while (std::getline(in, line)) {
    ++lineno;
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    auto bad = [&](const std::string& what) {
      return absl::InvalidArgumentError(absl::StrCat(origin, ":", lineno, ": ", what));
    };
    TraceRecord r;
    try {
      const json j = json::parse(line);
      const std::string type = j.value("type", "request");
      if (type == "advise")
        r.type = TraceRecord::Type::kAdvise;
      else if (type != "request")
        return bad(absl::StrCat("unknown type \"", type, "\""));
      r.id = j.at("id").get<std::string>();
      r.model = j.value("model", "");
      r.arrival_s = j.value("arrival_s", 0.0);
      r.after = j.value("after", "");
      r.delay_s = j.value("delay_s", 0.0);
      r.session = j.value("session", "");
      r.turn = j.value("turn", 0);
      r.prompt = j.value("prompt", "");
      r.prompt_tokens = j.value("prompt_tokens", 0);
      r.output_tokens = j.value("output_tokens", 0);
      r.ttft_ms = j.value("ttft_ms", 0u);
      r.tpot_ms = j.value("tpot_ms", 0u);
      r.priority = j.value("priority", 0);
      r.for_request = j.value("for", "");
      r.expected_arrival_s = j.value("expected_arrival_s", 0.0);
      if (j.contains("next_hops")) r.next_hops = j["next_hops"].get<std::vector<std::string>>();
    } catch (const json::exception& e) {
      return bad(absl::StrCat("malformed record: ", e.what()));
    }
    if (r.id.empty()) return bad("empty id");
    if (!ids.insert(r.id).second) return bad(absl::StrCat("duplicate id \"", r.id, "\""));
    if (!r.after.empty() && !ids.count(r.after)) {
      return bad(absl::StrCat("\"after\": \"", r.after, "\" is not an earlier record"));
    }
    if (r.arrival_s < 0 || r.delay_s < 0) return bad("negative arrival_s or delay_s");
    if (r.is_request()) {
      if (r.model.empty()) return bad("request without a model");
      if (r.output_tokens <= 0) return bad("output_tokens must be > 0");
      if (r.prompt.empty() && r.prompt_tokens <= 0) return bad("needs prompt or prompt_tokens > 0");
    }
    out.push_back(std::move(r));
  }
  return out;
}

absl::StatusOr<std::vector<TraceRecord>> ReadTrace(const std::string& path) {
  std::ifstream in(path);
  if (!in) return absl::NotFoundError(absl::StrCat("cannot open trace ", path));
  std::stringstream ss;
  ss << in.rdbuf();
  return ParseTrace(ss.str(), path);
}

std::string SynthesizePrompt(int tokens, uint64_t salt) {
  static const char* kWords[] = {"the",     "model", "serves", "many",    "tokens", "with",
                                 "memory",  "and",   "a",      "session", "keeps",  "its",
                                 "cache",   "warm",  "on",     "few",     "GPUs",   "while",
                                 "traffic", "moves", "in",     "bursts"};
  constexpr size_t kN = sizeof(kWords) / sizeof(kWords[0]);
  std::string s;
  uint64_t x = salt * 0x9E3779B97F4A7C15ull + 1;
  while (static_cast<int>(s.size()) < tokens) {
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    if (!s.empty()) s += ' ';
    s += kWords[x % kN];
  }
  s.resize(static_cast<size_t>(tokens));
  return s;
}

}  // namespace ballast::bench
