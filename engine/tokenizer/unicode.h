// Unicode character properties and normalization, through ICU, with the
// definitions the Hugging Face `tokenizers` library (Rust) uses: Rust's
// char::is_whitespace (White_Space), char::is_numeric (N*), the regex
// crate's \w, and char::to_lowercase (full mapping, one character at a time).
//
// Thread-safety: pure functions; ICU's singletons are thread-safe.
#pragma once

#include <string>
#include <string_view>

#include "absl/status/status.h"

namespace ballast::tokenizer {

enum class NormalForm { kNfc, kNfd, kNfkc, kNfkd };

// White_Space property (Rust char::is_whitespace).
bool IsWhitespace(char32_t cp);
// General category N* (Rust char::is_numeric).
bool IsNumeric(char32_t cp);
// ASCII punctuation or general category P* (tokenizers' Punctuation).
bool IsPunctuation(char32_t cp);
// The Rust regex crate's \w: Alphabetic, M*, Nd, Pc, Join_Control.
bool IsWordChar(char32_t cp);
// General category Mn (tokenizers' StripAccents removes these).
bool IsNonspacingMark(char32_t cp);

// Applies `form` to the valid UTF-8 `s` in place.
absl::Status Normalize(NormalForm form, std::string* s);
// Lowercases each character independently (no context rules such as the
// final sigma), like NormalizedString::lowercase.
void LowercaseEachChar(std::string* s);

}  // namespace ballast::tokenizer
