// UTF-8 helpers shared by the tokenizer and the streaming detokenizer.
//
// Invalid input is replaced the way Python's bytes.decode("utf-8", "replace")
// and Rust's String::from_utf8_lossy do it (Unicode's "maximal subpart"
// rule): each maximal prefix of a valid sequence, or each byte that cannot
// start one, becomes one U+FFFD.
//
// Thread-safety: free functions are pure; a Utf8Sanitizer is per stream and
// thread-compatible.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "absl/strings/string_view.h"

namespace ballast::tokenizer {

inline constexpr std::string_view kReplacementChar = "\xEF\xBF\xBD";  // U+FFFD

// Length of the UTF-8 sequence led by `b`, or 0 if `b` cannot lead one.
int Utf8SequenceLength(unsigned char b);
// Whether `c` may be byte `i` (1-based) of a sequence led by `lead`.
bool Utf8ValidContinuation(unsigned char lead, int i, unsigned char c);
// Whether `s` is entirely valid UTF-8.
bool IsValidUtf8(std::string_view s);
// Whether `s` is valid UTF-8 except that it may end inside a sequence.
bool IsValidUtf8Prefix(std::string_view s);
// `s` with invalid sequences replaced by U+FFFD (maximal subparts).
std::string SanitizeUtf8(std::string_view s);
// Decodes the code point at s[*pos] (s valid UTF-8) and advances *pos.
char32_t NextCodePoint(std::string_view s, size_t* pos);
// Debian's Abseil has its own string_view type: this bridges to it.
inline absl::string_view Sv(std::string_view s) { return absl::string_view(s.data(), s.size()); }
// Appends the UTF-8 encoding of `cp`.
void AppendUtf8(char32_t cp, std::string* out);

// Streaming form of SanitizeUtf8: bytes in, valid UTF-8 out; an incomplete
// trailing sequence is held back until more bytes come or Finish.
class Utf8Sanitizer {
 public:
  // Appends `bytes`; returns the text they complete (maybe empty).
  std::string Push(std::string_view bytes);
  // Ends the stream: an incomplete trailing sequence becomes U+FFFD.
  std::string Finish();

 private:
  std::string Drain(bool final);
  std::string pending_;
};

}  // namespace ballast::tokenizer
