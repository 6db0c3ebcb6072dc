#include "bench/trace_import.h"

#include <algorithm>
#include <climits>
#include <cmath>
#include <fstream>
#include <functional>
#include <map>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/time/time.h"
#include "bench/csv.h"
#include "nlohmann/json.hpp"

namespace ballast::bench {
namespace {

using nlohmann::json;

constexpr int kMooncakeBlockTokens = 512;
constexpr int64_t kMaxLength = int64_t{1} << 30;
// Salts of the unshared prompt tails: above every non-negative hash id.
constexpr uint64_t kTailSalt = uint64_t{1} << 63;

// "<file>:<line>: <what>".
absl::Status At(const std::string& file, int64_t line, absl::string_view what) {
  return absl::InvalidArgumentError(absl::StrCat(file, ":", line, ": ", what));
}

absl::Status OpenError(const std::string& file) {
  return absl::NotFoundError(absl::StrCat("cannot open trace input ", file));
}

absl::StatusOr<int64_t> CheckCount(int64_t v) {
  if (v < 0) return absl::InvalidArgumentError(absl::StrCat("negative length ", v));
  if (v > kMaxLength) {
    return absl::InvalidArgumentError(
        absl::StrCat("length ", v, " is out of range (at most ", kMaxLength, ")"));
  }
  return v;
}

// A token count: a non-negative integer (an integral number such as "12.0"
// too).
absl::StatusOr<int64_t> ParseCount(absl::string_view text) {
  int64_t v = 0;
  if (absl::SimpleAtoi(text, &v)) return CheckCount(v);
  double d = 0;
  if (absl::SimpleAtod(text, &d) && std::isfinite(d) && d == std::floor(d) && std::abs(d) <= 1e18) {
    return CheckCount(static_cast<int64_t>(d));
  }
  return absl::InvalidArgumentError(
      absl::StrCat("expected a non-negative integer, got \"", text, "\""));
}

// Seconds since the Unix epoch as a number (BurstGPT's Timestamp).
absl::StatusOr<absl::Time> ParseSeconds(absl::string_view text) {
  double d = 0;
  if (!absl::SimpleAtod(text, &d) || !std::isfinite(d)) {
    return absl::InvalidArgumentError(
        absl::StrCat("expected a number of seconds, got \"", text, "\""));
  }
  return absl::UnixEpoch() + absl::Seconds(d);
}

// A UTC datetime such as "2023-11-16 18:15:46.6805900" (Azure's TIMESTAMP):
// any number of fractional digits, ' ' or 'T' between date and time, and an
// optional "Z" or "+hh:mm" offset.
absl::StatusOr<absl::Time> ParseDatetime(absl::string_view text) {
  std::string s(absl::StripAsciiWhitespace(text));
  if (absl::EndsWith(s, "Z")) s.pop_back();
  for (const char* format : {"%Y-%m-%d %H:%M:%E*S", "%Y-%m-%d %H:%M:%E*S%Ez", "%Y-%m-%dT%H:%M:%E*S",
                             "%Y-%m-%dT%H:%M:%E*S%Ez"}) {
    absl::Time t;
    std::string err;
    // ParseTime also accepts "infinite-future"/"infinite-past": not a time here.
    if (absl::ParseTime(format, s, &t, &err) && t != absl::InfiniteFuture() &&
        t != absl::InfinitePast()) {
      return t;
    }
  }
  return absl::InvalidArgumentError(absl::StrCat(
      "expected a datetime such as \"2023-11-16 18:15:46.6805900\", got \"", text, "\""));
}

int Scale(int64_t n, double f) {
  const double v = std::round(static_cast<double>(n) * f);
  return static_cast<int>(std::clamp(v, 1.0, static_cast<double>(INT_MAX)));
}

// Calls `row` for every data row of a CSV file whose header has `names`;
// adds the rows read to *rows.
absl::Status ForEachCsvRow(const std::string& file, std::vector<std::string> names,
                           const std::function<absl::Status(const CsvRow&)>& row, int64_t* rows) {
  std::ifstream in(file, std::ios::binary);
  if (!in) return OpenError(file);
  CsvReader csv(&in, file);
  auto cols = ReadCsvHeader(&csv, std::move(names));
  if (!cols.ok()) return cols.status();
  std::vector<std::string> fields;
  while (true) {
    auto more = csv.Next(&fields);
    if (!more.ok()) return more.status();
    if (!*more) return absl::OkStatus();
    ++*rows;
    CsvRow rec(*cols, fields, file, csv.line());
    if (auto st = rec.CheckWidth(); !st.ok()) return st;
    if (auto st = row(rec); !st.ok()) return st;
  }
}

// One request of a source trace, before windowing and mapping.
struct Row {
  absl::Time t;
  int64_t prompt = 0, output = 0;
  int service = 0;
  bool failed = false;        // burstgpt: Response tokens 0
  bool has_hash_ids = false;  // mooncake
  std::vector<int64_t> hash_ids;
};

Row MakeRow(absl::Time t, int64_t prompt, int64_t output, int service, bool failed = false) {
  Row r;
  r.t = t;
  r.prompt = prompt;
  r.output = output;
  r.service = service;
  r.failed = failed;
  return r;
}

// Everything read from the inputs.
struct Source {
  std::vector<Row> rows;
  std::vector<std::string> services;
  std::map<std::string, int> service_index;
  int64_t lines = 0;

  int Service(const std::string& name) {
    auto [it, added] = service_index.emplace(name, static_cast<int>(services.size()));
    if (added) services.push_back(name);
    return it->second;
  }
};

absl::Status ReadAzure(const std::string& file, int service, Source* src) {
  return ForEachCsvRow(
      file, {"TIMESTAMP", "ContextTokens", "GeneratedTokens"},
      [&](const CsvRow& rec) -> absl::Status {
        auto t = rec.Parse(0, ParseDatetime);
        if (!t.ok()) return t.status();
        auto prompt = rec.Parse(1, ParseCount);
        if (!prompt.ok()) return prompt.status();
        auto output = rec.Parse(2, ParseCount);
        if (!output.ok()) return output.status();
        src->rows.push_back(MakeRow(*t, *prompt, *output, service));
        return absl::OkStatus();
      },
      &src->lines);
}

absl::Status ReadBurstGpt(const std::string& file, bool by_log_type, Source* src) {
  std::vector<std::string> names = {"Timestamp", "Model", "Request tokens", "Response tokens"};
  if (by_log_type) names.push_back("Log Type");
  return ForEachCsvRow(
      file, names,
      [&](const CsvRow& rec) -> absl::Status {
        auto t = rec.Parse(0, ParseSeconds);
        if (!t.ok()) return t.status();
        std::string model(absl::StripAsciiWhitespace(rec.Text(1)));
        if (model.empty()) return rec.Bad(1, "empty");
        auto prompt = rec.Parse(2, ParseCount);
        if (!prompt.ok()) return prompt.status();
        auto output = rec.Parse(3, ParseCount);
        if (!output.ok()) return output.status();
        if (by_log_type) {
          const absl::string_view type = absl::StripAsciiWhitespace(rec.Text(4));
          if (type.empty()) return rec.Bad(4, "empty");
          absl::StrAppend(&model, " (", type, ")");
        }
        const bool failed = *output == 0;
        // A failed row takes no service: it never gets a model.
        src->rows.push_back(
            MakeRow(*t, *prompt, *output, failed ? -1 : src->Service(model), failed));
        return absl::OkStatus();
      },
      &src->lines);
}

// A Mooncake field: a number (`count`: a non-negative integer token count).
absl::StatusOr<double> JsonNumber(const json& j, const char* key, bool count) {
  const auto it = j.find(key);
  const absl::string_view expected = count ? "a non-negative integer" : "a number";
  absl::Status bad;
  if (it == j.end() || it->is_null()) {
    bad = absl::InvalidArgumentError("missing");
  } else if (!it->is_number()) {
    bad = absl::InvalidArgumentError(
        absl::StrCat("expected ", expected, ", got ", it->type_name(), " ", it->dump()));
  } else if (count) {
    auto v = ParseCount(it->dump());
    if (v.ok()) return static_cast<double>(*v);
    bad = v.status();
  } else if (std::isfinite(it->get<double>())) {
    return it->get<double>();
  } else {
    bad = absl::InvalidArgumentError(absl::StrCat("expected ", expected, ", got ", it->dump()));
  }
  return absl::InvalidArgumentError(absl::StrCat("field \"", key, "\": ", bad.message()));
}

absl::Status ReadHashIds(const json& j, Row* r) {
  const auto it = j.find("hash_ids");
  if (it == j.end() || it->is_null()) return absl::OkStatus();
  if (!it->is_array()) {
    return absl::InvalidArgumentError(
        absl::StrCat("field \"hash_ids\": expected an array of integers, got ", it->type_name(),
                     " ", it->dump()));
  }
  r->has_hash_ids = true;
  for (size_t i = 0; i < it->size(); ++i) {
    const json& v = (*it)[i];
    const bool fits = v.is_number_integer() &&
                      (!v.is_number_unsigned() || v.get<uint64_t>() <= uint64_t{INT64_MAX});
    if (!fits) {
      return absl::InvalidArgumentError(
          absl::StrCat("field \"hash_ids\"[", i, "]: expected an integer, got ", v.dump()));
    }
    r->hash_ids.push_back(v.get<int64_t>());
  }
  return absl::OkStatus();
}

absl::StatusOr<Row> MooncakeRow(const json& j) {
  if (!j.is_object()) {
    return absl::InvalidArgumentError(absl::StrCat("expected a JSON object, got ", j.type_name()));
  }
  Row r;
  auto ms = JsonNumber(j, "timestamp", false);
  if (!ms.ok()) return ms.status();
  auto prompt = JsonNumber(j, "input_length", true);
  if (!prompt.ok()) return prompt.status();
  auto output = JsonNumber(j, "output_length", true);
  if (!output.ok()) return output.status();
  r.t = absl::UnixEpoch() + absl::Milliseconds(*ms);
  r.prompt = static_cast<int64_t>(*prompt);
  r.output = static_cast<int64_t>(*output);
  if (auto st = ReadHashIds(j, &r); !st.ok()) return st;
  return r;
}

absl::Status ReadMooncake(const std::string& file, int service, Source* src) {
  std::ifstream in(file, std::ios::binary);
  if (!in) return OpenError(file);
  std::string line;
  for (int64_t lineno = 1; std::getline(in, line); ++lineno) {
    if (absl::StripAsciiWhitespace(line).empty()) continue;
    ++src->lines;
    json j;
    try {
      j = json::parse(line);
    } catch (const json::exception& e) {
      return At(file, lineno, absl::StrCat("malformed JSON: ", e.what()));
    }
    auto r = MooncakeRow(j);
    if (!r.ok()) return At(file, lineno, r.status().message());
    r->service = service;
    src->rows.push_back(std::move(*r));
  }
  return absl::OkStatus();
}

absl::Status Validate(const ImportOptions& o) {
  auto bad = [](absl::string_view flag, absl::string_view want, double v) {
    return absl::InvalidArgumentError(absl::StrCat(flag, ": expected ", want, ", got ", v));
  };
  if (o.inputs.empty()) return absl::InvalidArgumentError("--input: no trace file given");
  if (o.models.empty()) return absl::InvalidArgumentError("--models: no model given");
  if (!(o.start_s >= 0) || !std::isfinite(o.start_s)) {
    return bad("--start", "seconds >= 0", o.start_s);
  }
  if (!(o.duration_s > 0)) return bad("--duration", "seconds > 0", o.duration_s);
  if (!(o.length_scale > 0) || !std::isfinite(o.length_scale)) {
    return bad("--length-scale", "a number > 0", o.length_scale);
  }
  if (!(o.time_scale > 0) || !std::isfinite(o.time_scale)) {
    return bad("--time-scale", "a number > 0", o.time_scale);
  }
  if (o.by_log_type && o.format != ImportFormat::kBurstGpt) {
    return absl::InvalidArgumentError("--by-log-type applies to burstgpt traces only");
  }
  if (o.format != ImportFormat::kBurstGpt && o.inputs.size() > o.models.size()) {
    return absl::InvalidArgumentError(absl::StrCat(
        ImportFormatName(o.format), ": ", o.inputs.size(),
        " input files (one service each) but --models names ", o.models.size(), " model",
        o.models.size() == 1 ? "" : "s", " (", absl::StrJoin(o.models, ","), ")"));
  }
  return absl::OkStatus();
}

absl::Status ReadInputs(const ImportOptions& o, Source* src) {
  for (size_t i = 0; i < o.inputs.size(); ++i) {
    const std::string& file = o.inputs[i];
    absl::Status st;
    if (o.format == ImportFormat::kBurstGpt) {
      st = ReadBurstGpt(file, o.by_log_type, src);
    } else {
      // One service per file, even when a file is named twice.
      src->services.push_back(file);
      const int service = static_cast<int>(src->services.size() - 1);
      st = o.format == ImportFormat::kAzure ? ReadAzure(file, service, src)
                                            : ReadMooncake(file, service, src);
    }
    if (!st.ok()) return st;
  }
  return absl::OkStatus();
}

// A request kept by the window, at `t` seconds of trace time.
struct Kept {
  double t;
  const Row* row;
};

// Model index per service: burstgpt's services in order of first appearance
// among the kept requests, the other formats' in file order. Fills
// res->mapping; more services than models is an error.
absl::StatusOr<std::vector<int>> MapServices(const ImportOptions& o, const Source& src,
                                             const std::vector<Kept>& kept, ImportResult* res) {
  std::vector<int> model(src.services.size(), -1);
  std::vector<std::string> order;
  auto add = [&](int service) {
    if (model[service] >= 0) return;
    model[service] = static_cast<int>(order.size());
    order.push_back(src.services[service]);
  };
  if (o.format == ImportFormat::kBurstGpt) {
    for (const Kept& k : kept) add(k.row->service);
  } else {
    for (size_t s = 0; s < src.services.size(); ++s) add(static_cast<int>(s));
  }
  if (order.size() > o.models.size()) {
    return absl::InvalidArgumentError(
        absl::StrCat("the trace has ", order.size(), " services (", absl::StrJoin(order, ", "),
                     ") but --models names ", o.models.size(), " (", absl::StrJoin(o.models, ","),
                     "); give at least ", order.size(), " models"));
  }
  for (size_t i = 0; i < order.size(); ++i) res->mapping.emplace_back(order[i], o.models[i]);
  return model;
}

// The rows inside the window, sorted by time (ties in input order); counts
// the rest.
std::vector<Kept> Window(const ImportOptions& o, const Source& src, ImportResult* res) {
  std::vector<Kept> kept;
  if (src.rows.empty()) return kept;
  absl::Time first = absl::InfiniteFuture(), last = absl::InfinitePast();
  for (const Row& r : src.rows) {
    first = std::min(first, r.t);
    last = std::max(last, r.t);
  }
  res->trace_span_s = absl::ToDoubleSeconds(last - first);
  for (const Row& r : src.rows) {
    const double t = absl::ToDoubleSeconds(r.t - first);
    if (t < o.start_s || t >= o.start_s + o.duration_s) {
      ++res->outside_window;
    } else if (r.failed) {
      ++res->failed;
    } else {
      kept.push_back({t, &r});
    }
  }
  std::stable_sort(kept.begin(), kept.end(),
                   [](const Kept& a, const Kept& b) { return a.t < b.t; });
  return kept;
}

}  // namespace

absl::StatusOr<ImportFormat> ParseImportFormat(absl::string_view name) {
  if (name == "azure") return ImportFormat::kAzure;
  if (name == "burstgpt") return ImportFormat::kBurstGpt;
  if (name == "mooncake") return ImportFormat::kMooncake;
  if (name.empty())
    return absl::InvalidArgumentError("--format: missing (azure, burstgpt or mooncake)");
  return absl::InvalidArgumentError(
      absl::StrCat("--format: expected azure, burstgpt or mooncake, got \"", name, "\""));
}

const char* ImportFormatName(ImportFormat f) {
  switch (f) {
    case ImportFormat::kAzure:
      return "azure";
    case ImportFormat::kBurstGpt:
      return "burstgpt";
    case ImportFormat::kMooncake:
      return "mooncake";
  }
  return "?";
}

std::string BlockPrompt(const std::vector<int64_t>& hash_ids, int tokens, int block_tokens,
                        uint64_t tail_salt) {
  const size_t n = static_cast<size_t>(std::max(tokens, 0));
  std::string s;
  s.reserve(n + static_cast<size_t>(block_tokens));
  for (int64_t id : hash_ids) {
    if (s.size() >= n) break;
    s += SynthesizePrompt(block_tokens, static_cast<uint64_t>(id));
  }
  if (s.size() < n) s += SynthesizePrompt(static_cast<int>(n - s.size()), tail_salt);
  s.resize(n);
  return s;
}

absl::StatusOr<ImportResult> ImportTrace(const ImportOptions& o) {
  if (auto st = Validate(o); !st.ok()) return st;
  Source src;
  if (auto st = ReadInputs(o, &src); !st.ok()) return st;
  ImportResult res;
  res.rows = src.lines;
  const std::vector<Kept> kept = Window(o, src, &res);
  auto model = MapServices(o, src, kept, &res);
  if (!model.ok()) return model.status();
  const int block =
      std::max(1, static_cast<int>(std::lround(kMooncakeBlockTokens * o.length_scale)));
  res.records.reserve(kept.size());
  for (size_t i = 0; i < kept.size(); ++i) {
    const Row& row = *kept[i].row;
    TraceRecord r;
    r.id = absl::StrCat("r", i);
    r.model = o.models[(*model)[row.service]];
    r.arrival_s = (kept[i].t - o.start_s) * o.time_scale;
    r.prompt_tokens = Scale(row.prompt, o.length_scale);
    r.output_tokens = Scale(row.output, o.length_scale);
    res.outputs_raised += row.output == 0;
    if (row.has_hash_ids)
      r.prompt = BlockPrompt(row.hash_ids, r.prompt_tokens, block, kTailSalt + i);
    res.records.push_back(std::move(r));
  }
  return res;
}

std::string FormatImportSummary(const ImportOptions& o, const ImportResult& r,
                                const std::string& out) {
  std::string s = absl::StrFormat(
      "imported %d requests into %s from %d %s file%s (%d rows); ", r.records.size(), out,
      o.inputs.size(), ImportFormatName(o.format), o.inputs.size() == 1 ? "" : "s", r.rows);
  std::vector<std::string> skipped;
  if (o.format == ImportFormat::kBurstGpt) {
    skipped.push_back(absl::StrCat(r.failed, " failed (Response tokens 0)"));
  }
  skipped.push_back(absl::StrCat(r.outside_window, " outside the window"));
  absl::StrAppend(&s, "skipped ", absl::StrJoin(skipped, ", "), "; ");
  if (r.outputs_raised > 0) {
    absl::StrAppend(&s, r.outputs_raised, " zero-token outputs sent as 1; ");
  }
  if (std::isinf(o.duration_s)) {
    absl::StrAppendFormat(&s, "window [%g s, end) of a %g s trace", o.start_s, r.trace_span_s);
  } else {
    absl::StrAppendFormat(&s, "window [%g, %g) s of a %g s trace", o.start_s,
                          o.start_s + o.duration_s, r.trace_span_s);
  }
  if (o.time_scale != 1) absl::StrAppendFormat(&s, ", time scale %g", o.time_scale);
  if (o.length_scale != 1) absl::StrAppendFormat(&s, ", length scale %g", o.length_scale);
  std::vector<std::string> pairs;
  for (const auto& [service, model] : r.mapping)
    pairs.push_back(absl::StrCat(service, " -> ", model));
  absl::StrAppend(&s, "; models: ", pairs.empty() ? "none" : absl::StrJoin(pairs, ", "));
  return s;
}

}  // namespace ballast::bench
