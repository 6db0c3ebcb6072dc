#include "sim/step_replay.h"

#include <algorithm>
#include <array>
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
  const size_t mid = v.size() / 2;
  std::nth_element(v.begin(), v.begin() + static_cast<std::ptrdiff_t>(mid), v.end());
  return v[mid];
}

}  // namespace

absl::StatusOr<std::vector<RecordedStep>> ParseRecordedSteps(const std::string& csv,
                                                             const std::string& origin) {
  std::vector<absl::string_view> lines = absl::StrSplit(csv, '\n', absl::SkipWhitespace());
  if (lines.empty()) return absl::InvalidArgumentError(absl::StrCat(origin, ": empty"));
  std::map<std::string, size_t> col;
  std::vector<absl::string_view> header = absl::StrSplit(absl::StripAsciiWhitespace(lines[0]), ',');
  for (size_t i = 0; i < header.size(); ++i) col[std::string(header[i])] = i;
  for (const char* c : kColumns) {
    if (!col.count(c)) {
      return absl::InvalidArgumentError(
          absl::StrCat(origin, ": the header has no column \"", c, "\""));
    }
  }
  const bool has_ms = col.count("ms") > 0;
  std::vector<RecordedStep> steps;
  for (size_t l = 1; l < lines.size(); ++l) {
    std::vector<absl::string_view> f = absl::StrSplit(absl::StripAsciiWhitespace(lines[l]), ',');
    auto get = [&](const char* name, double* v) -> absl::Status {
      const size_t i = col.at(name);
      if (i >= f.size() || !absl::SimpleAtod(f[i], v)) {
        return absl::InvalidArgumentError(
            absl::StrCat(origin, " line ", l + 1, ": column \"", name, "\" is not a number"));
      }
      return absl::OkStatus();
    };
    double v[5], ms = -1;
    for (size_t c = 0; c < kColumns.size(); ++c) {
      if (auto s = get(kColumns[c], &v[c]); !s.ok()) return s;
      if (v[c] < 0) {
        return absl::InvalidArgumentError(
            absl::StrCat(origin, " line ", l + 1, ": column \"", kColumns[c], "\" is negative"));
      }
    }
    if (has_ms) {
      if (auto s = get("ms", &ms); !s.ok()) return s;
    }
    RecordedStep r;
    r.work = {static_cast<int>(v[0]), v[1], static_cast<int>(v[2]), v[3], static_cast<int>(v[4])};
    r.ms = ms;
    steps.push_back(r);
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
