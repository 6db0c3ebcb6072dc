#include "engine/chat/work.h"

#include <algorithm>
#include <iterator>
#include <string>

#include "engine/chat/builtins.h"

namespace ballast::chat {
namespace {

constexpr int kBytesPerStepShift = 6;  // 64 bytes a step

// 1000000 as "1,000,000" (n >= 0).
std::string WithCommas(int64_t n) {
  const std::string digits = std::to_string(n);
  std::string out;
  for (size_t i = 0; i < digits.size(); ++i) {
    if (i > 0 && (digits.size() - i) % 3 == 0) out.push_back(',');
    out.push_back(digits[i]);
  }
  return out;
}

}  // namespace

int64_t TextSteps(uint64_t bytes) { return static_cast<int64_t>(bytes >> kBytesPerStepShift); }

bool ConstantTimeFilter(std::string_view name, const Value& input) {
  if (name == "default" || name == "d") return true;
  if (input.is_dict()) return name == "length" || name == "count";
  return input.is_sequence() &&
         (name == "length" || name == "count" || name == "first" || name == "last");
}

bool ScanningTest(std::string_view name) {
  static constexpr std::string_view kScanning[] = {
      "lower", "upper", "in", "eq", "equalto", "==", "ne",          "!=",       "lt",    "<",
      "le",    "<=",    "gt", ">",  "ge",      ">=", "greaterthan", "lessthan", "sameas"};
  return std::find(std::begin(kScanning), std::end(kScanning), name) != std::end(kScanning);
}

bool ReadsText(bool is_filter, std::string_view name) {
  return is_filter ? name == "wordcount" : (name == "lower" || name == "upper");
}

int64_t SizeSteps(const Value& v) {
  const auto bytes = [](const Value& item) {
    return item.is_string() ? item.AsString().size() : 0;
  };
  if (v.is_string()) return static_cast<int64_t>(v.AsString().size() >> kBytesPerStepShift);
  if (v.is_sequence()) {
    uint64_t held = 0;
    for (const Value& item : v.AsList()) held += bytes(item);
    return static_cast<int64_t>((v.AsList().size() >> 4) + (held >> kBytesPerStepShift));
  }
  if (v.is_dict()) {
    uint64_t held = 0;
    for (const auto& [key, item] : v.AsDict().items) held += bytes(key) + bytes(item);
    return static_cast<int64_t>((v.AsDict().items.size() >> 4) + (held >> kBytesPerStepShift));
  }
  if (v.is_object()) return static_cast<int64_t>(v.AsObject().attrs.items.size() >> 4);
  return 0;
}

absl::StatusOr<Value> CheckSize(Value v) {
  if (v.is_string()) {
    if (auto st = CheckStringBytes(v.AsString().size()); !st.ok()) return st;
  }
  if (v.depth() > kMaxValueDepth) {
    return absl::OutOfRangeError(Cat("RecursionError: a value nested ", v.depth(),
                                     " deep is over the limit of ", kMaxValueDepth));
  }
  return v;
}

absl::Status WorkBudget::Charge(int64_t n) {
  steps_ += n;
  if (steps_ <= max_steps_) return absl::OkStatus();
  return absl::ResourceExhaustedError(
      Cat("the render took more than ", WithCommas(max_steps_),
          " steps (statements, expressions, loop iterations and the size of values and text)"));
}

}  // namespace ballast::chat
