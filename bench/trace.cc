#include "bench/trace.h"

#include <cmath>
#include <cstdint>
#include <fstream>
#include <limits>
#include <set>
#include <sstream>
#include <type_traits>

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

namespace {

template <typename T>
const char* Expected() {
  if constexpr (std::is_same_v<T, std::string>) return "a string";
  if constexpr (std::is_same_v<T, std::vector<std::string>>) return "an array of strings";
  return "a number";
}

// Sets *out to j[key] if present (and not null); a value of the wrong type is
// an error naming the field, what it expected and what it got.
template <typename T>
absl::Status Get(const json& j, const char* key, T* out) {
  const auto it = j.find(key);
  if (it == j.end() || it->is_null()) return absl::OkStatus();
  bool ok = std::is_same_v<T, std::string> ? it->is_string() : !it->is_boolean();
  if constexpr (std::is_arithmetic_v<T>) ok = it->is_number();
  if constexpr (std::is_integral_v<T>) {
    // A whole number that fits: converting 1e300 (or 1.5) to an integer
    // is undefined, not an error (found by fuzz/trace_fuzzer).
    constexpr double lo = static_cast<double>(std::numeric_limits<T>::min());
    constexpr double hi = static_cast<double>(std::numeric_limits<T>::max()) + 1.0;
    if (it->is_number_float()) {
      const double d = it->template get<double>();
      ok = std::isfinite(d) && d == std::floor(d) && d >= lo && d < hi;
    } else if (it->is_number_unsigned()) {
      ok = it->template get<uint64_t>() <= static_cast<uint64_t>(std::numeric_limits<T>::max());
    } else if (it->is_number_integer()) {
      const int64_t v = it->template get<int64_t>();
      ok = static_cast<double>(v) >= lo && static_cast<double>(v) < hi;
    }
  }
  if (ok) {
    try {
      *out = it->get<T>();
      return absl::OkStatus();
    } catch (const json::exception&) {
    }
  }
  return absl::InvalidArgumentError(absl::StrCat("field \"", key, "\": expected ", Expected<T>(),
                                                 ", got ", it->type_name(), " ", it->dump()));
}

absl::Status ParseRecord(const json& j, TraceRecord* r) {
  if (!j.is_object()) return absl::InvalidArgumentError("expected a JSON object");
  std::string type = "request";
  absl::Status st = Get(j, "type", &type);
  if (st.ok() && type == "advise") r->type = TraceRecord::Type::kAdvise;
  if (st.ok() && type != "advise" && type != "request") {
    return absl::InvalidArgumentError(absl::StrCat("unknown type \"", type, "\""));
  }
  if (!j.contains("id")) return absl::InvalidArgumentError("field \"id\": missing");
  int64_t ttft = 0, tpot = 0;
  for (absl::Status s :
       {st, Get(j, "id", &r->id), Get(j, "model", &r->model), Get(j, "arrival_s", &r->arrival_s),
        Get(j, "after", &r->after), Get(j, "delay_s", &r->delay_s), Get(j, "session", &r->session),
        Get(j, "turn", &r->turn), Get(j, "prompt", &r->prompt),
        Get(j, "prompt_tokens", &r->prompt_tokens), Get(j, "output_tokens", &r->output_tokens),
        Get(j, "ttft_ms", &ttft), Get(j, "tpot_ms", &tpot), Get(j, "priority", &r->priority),
        Get(j, "for", &r->for_request), Get(j, "expected_arrival_s", &r->expected_arrival_s),
        Get(j, "next_hops", &r->next_hops)}) {
    if (!s.ok()) return s;
  }
  if (ttft < 0 || tpot < 0 || ttft > UINT32_MAX || tpot > UINT32_MAX) {
    return absl::InvalidArgumentError("field \"ttft_ms\"/\"tpot_ms\": out of range");
  }
  r->ttft_ms = static_cast<uint32_t>(ttft);
  r->tpot_ms = static_cast<uint32_t>(tpot);
  return absl::OkStatus();
}

}  // namespace

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
    TraceRecord r;
    // Errors name the file, the line, the record's index and id when known.
    auto bad = [&](const std::string& what) {
      return absl::InvalidArgumentError(
          absl::StrCat(origin, ":", lineno, " (record ", out.size(),
                       r.id.empty() ? "" : absl::StrCat(", id \"", r.id, "\""), "): ", what));
    };
    json j;
    try {
      j = json::parse(line);
    } catch (const json::exception& e) {
      return bad(absl::StrCat("malformed record: ", e.what()));
    }
    if (auto st = ParseRecord(j, &r); !st.ok()) return bad(std::string(st.message()));
    if (r.id.empty()) return bad("empty id");
    if (!ids.insert(r.id).second) return bad(absl::StrCat("duplicate id \"", r.id, "\""));
    if (!r.after.empty() && !ids.count(r.after)) {
      return bad(absl::StrCat("\"after\": \"", r.after, "\" is not an earlier record"));
    }
    if (r.arrival_s < 0 || r.delay_s < 0) return bad("negative arrival_s or delay_s");
    if (!(r.arrival_s <= kMaxTraceSeconds && r.delay_s <= kMaxTraceSeconds &&
          r.expected_arrival_s <= kMaxTraceSeconds)) {
      return bad(absl::StrCat("arrival_s, delay_s and expected_arrival_s must be at most ",
                              kMaxTraceSeconds, " s (about 116 days)"));
    }
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
