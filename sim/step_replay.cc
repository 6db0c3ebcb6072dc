#include "sim/step_replay.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <limits>
#include <map>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"

namespace ballast::sim {
namespace {

constexpr std::array<const char*, 5> kColumns = {
    "decode_tokens", "decode_context", "prefill_tokens", "prefill_attention", "prefill_logits"};

// The group of a step (an index into kGroups).
constexpr std::array<const char*, 5> kGroups = {"decode 1-32", "decode 33-128", "decode 129-512",
                                                "decode 513+", "with prefill"};
int GroupOf(const StepWork& w) {
  if (w.prefill_tokens > 0) return 4;
  if (w.decode_tokens <= 32) return 0;
  if (w.decode_tokens <= 128) return 1;
  if (w.decode_tokens <= 512) return 2;
  return 3;
}

double Median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const size_t mid = v.size() / 2;
  return v.size() % 2 ? v[mid] : (v[mid - 1] + v[mid]) / 2;
}

// One data row of ParseRecordedSteps' CSV (`col`: the header's column
// indices); errors start with `where` (the file and line).
absl::StatusOr<RecordedStep> ParseRow(absl::string_view line,
                                      const std::map<std::string, size_t>& col, bool has_ms,
                                      const std::string& where) {
  std::vector<absl::string_view> f = absl::StrSplit(line, ',');
  auto field = [&](const char* name) -> absl::string_view {
    const size_t i = col.at(name);
    return i < f.size() ? absl::StripAsciiWhitespace(f[i]) : absl::string_view();
  };
  auto bad = [&](const char* name, const char* what) {
    return absl::InvalidArgumentError(absl::StrCat(where, ": column \"", name, "\" is not ", what));
  };
  // A count: a whole number in [0, INT_MAX].
  auto count = [&](const char* name, int* v) -> absl::Status {
    int64_t x = 0;
    if (!absl::SimpleAtoi(field(name), &x) || x < 0 || x > std::numeric_limits<int>::max()) {
      return bad(name, "a whole number in [0, 2^31)");
    }
    *v = static_cast<int>(x);
    return absl::OkStatus();
  };
  // A finite number, >= 0 unless `any_sign`.
  auto number = [&](const char* name, double* v, bool any_sign = false) -> absl::Status {
    if (!absl::SimpleAtod(field(name), v) || !std::isfinite(*v) || (!any_sign && *v < 0)) {
      return bad(name, any_sign ? "a finite number" : "a finite number >= 0");
    }
    return absl::OkStatus();
  };
  RecordedStep r;
  StepWork& w = r.work;
  for (const absl::Status& st :
       {count("decode_tokens", &w.decode_tokens), number("decode_context", &w.decode_context),
        count("prefill_tokens", &w.prefill_tokens),
        number("prefill_attention", &w.prefill_attention),
        count("prefill_logits", &w.prefill_logits),
        has_ms ? number("ms", &r.ms, true) : absl::OkStatus()}) {
    if (!st.ok()) return st;
  }
  return r;
}

}  // namespace

absl::StatusOr<std::vector<RecordedStep>> ParseRecordedSteps(const std::string& csv,
                                                             const std::string& origin) {
  std::vector<absl::string_view> lines = absl::StrSplit(csv, '\n');
  size_t first = 0;  // the header: the first line that is not blank
  while (first < lines.size() && absl::StripAsciiWhitespace(lines[first]).empty()) ++first;
  if (first == lines.size()) return absl::InvalidArgumentError(absl::StrCat(origin, ": empty"));
  std::map<std::string, size_t> col;
  std::vector<absl::string_view> header = absl::StrSplit(lines[first], ',');
  for (size_t i = 0; i < header.size(); ++i) {
    const std::string name(absl::StripAsciiWhitespace(header[i]));
    if (!col.emplace(name, i).second) {
      return absl::InvalidArgumentError(
          absl::StrCat(origin, ": the header names column \"", name, "\" twice"));
    }
  }
  for (const char* c : kColumns) {
    if (!col.count(c)) {
      return absl::InvalidArgumentError(
          absl::StrCat(origin, ": the header has no column \"", c, "\""));
    }
  }
  const bool has_ms = col.count("ms") > 0;
  std::vector<RecordedStep> steps;
  for (size_t l = first + 1; l < lines.size(); ++l) {
    if (absl::StripAsciiWhitespace(lines[l]).empty()) continue;
    auto r = ParseRow(lines[l], col, has_ms, absl::StrCat(origin, " line ", l + 1));
    if (!r.ok()) return r.status();
    steps.push_back(*r);
  }
  return steps;
}

std::vector<StepGroup> CompareSteps(const EngineModel& model, const ModelShape& shape,
                                    const std::vector<RecordedStep>& steps) {
  std::vector<StepGroup> groups(kGroups.size() + 1);
  std::vector<std::vector<double>> errors(groups.size());
  for (size_t g = 0; g < kGroups.size(); ++g) groups[g].name = kGroups[g];
  groups.back().name = "all";
  for (const RecordedStep& s : steps) {
    if (s.ms <= 0) continue;
    const double p = model.StepSeconds(shape, s.work) * 1e3;
    for (size_t g : {static_cast<size_t>(GroupOf(s.work)), groups.size() - 1}) {
      ++groups[g].steps;
      groups[g].measured_ms += s.ms;
      groups[g].predicted_ms += p;
      errors[g].push_back(p / s.ms - 1);
    }
  }
  std::vector<StepGroup> out;
  for (size_t g = 0; g < groups.size(); ++g) {
    if (groups[g].steps == 0) continue;
    groups[g].median_error = Median(errors[g]);
    out.push_back(groups[g]);
  }
  return out;
}

}  // namespace ballast::sim
