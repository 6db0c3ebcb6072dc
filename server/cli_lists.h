// Comma-separated list flags of the `ballast` subcommands ("a,b,c",
// "1,2,4"): split, and parsed as positive numbers.
//
// Thread-safety: pure functions.
#pragma once

#include <string>
#include <type_traits>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"
#include "absl/strings/string_view.h"

namespace ballast::server {

// The non-empty items of a comma-separated list.
inline std::vector<std::string> SplitList(const std::string& s) {
  return absl::StrSplit(s, ',', absl::SkipEmpty());
}

// Parses a comma-separated list of positive numbers (int or double) into
// `out` (cleared first). False when an item is not a positive number or the
// list is empty.
template <typename T>
bool ParsePositiveList(const std::string& s, std::vector<T>* out) {
  static_assert(std::is_same_v<T, int> || std::is_same_v<T, double>);
  out->clear();
  for (absl::string_view part : absl::StrSplit(s, ',', absl::SkipEmpty())) {
    T v{};
    if constexpr (std::is_same_v<T, int>) {
      if (!absl::SimpleAtoi(part, &v) || v <= 0) return false;
    } else {
      if (!absl::SimpleAtod(part, &v) || !(v > 0)) return false;
    }
    out->push_back(v);
  }
  return !out->empty();
}

}  // namespace ballast::server
