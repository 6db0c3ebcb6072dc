// Cat(): string concatenation for the chat-template interpreter's messages.
//
// absl::StrCat does not take std::string_view in builds where
// absl::string_view is its own type (Debian's Abseil), so the interpreter
// uses this instead: strings, string views and integers, appended in order.
//
// Thread-safety: pure functions.
#pragma once

#include <string>
#include <string_view>
#include <type_traits>

#include "absl/strings/string_view.h"

namespace ballast::chat {

namespace internal {
inline void CatAppend(std::string* out, std::string_view s) { out->append(s); }
inline void CatAppend(std::string* out, absl::string_view s) { out->append(s.data(), s.size()); }
inline void CatAppend(std::string* out, const char* s) { out->append(s); }
inline void CatAppend(std::string* out, const std::string& s) { out->append(s); }
template <typename T>
requires std::is_integral_v<T>
void CatAppend(std::string* out, T v) { out->append(std::to_string(v)); }
}  // namespace internal

template <typename... Args>
std::string Cat(const Args&... args) {
  std::string out;
  (internal::CatAppend(&out, args), ...);
  return out;
}

}  // namespace ballast::chat
