// UTF-8 and Python `str` helpers for the chat-template interpreter.
//
// Jinja runs on Python strings: lengths, indices and slices count code
// points, `strip()`/`split()` use Python's notion of whitespace, and
// `upper()`/`lower()` map case. These helpers give the same answers on UTF-8
// bytes. Invalid UTF-8 never fails: each invalid byte counts as one code
// point and is copied through unchanged.
//
// Case mapping covers Latin (ASCII, Latin-1, Extended-A, Extended
// Additional), Greek, Cyrillic, Armenian and full-width Latin letters, plus
// the expansions ß → SS and İ → i̇; other scripts (mostly uncased: CJK,
// Arabic, ...) are left unchanged, and Greek final-sigma context is not
// applied.
//
// Thread-safety: pure functions, safe from any thread.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>
#include <vector>

namespace ballast::chat::unicode {

// Decodes the code point starting at s[i] into *cp and returns its length in
// bytes (1..4). An invalid byte decodes as itself with length 1.
int DecodeAt(std::string_view s, size_t i, char32_t* cp);
// Escaping's fast path (reprs, JSON): the run of printable ASCII other than
// `quote` and '\\' at s[*i], appended to *out as is but only until *out
// holds limit + 1 bytes; *i moves past the whole run. False (nothing done)
// when s[*i] starts no such run.
bool AppendPlainRun(std::string_view s, char quote, size_t limit, size_t* i, std::string* out);

// Substring search in time linear in the sizes (glibc's memmem, two-way
// for long needles), where std::string::find takes O(n m) at worst: seven
// searches for 500,000 'a's and a 'b' in 1,000,000 'a's took 69 s, now
// 0.12 s (docs/benchmarks.md). Find: the first `needle` at or after
// `from`, npos when none (or from > hay.size()). Reversed: `s` back to
// front; ReverseFind (rfind) is Find over reversed copies.
size_t Find(std::string_view hay, std::string_view needle, size_t from = 0);
std::string Reversed(std::string_view s);
size_t ReverseFind(std::string_view hay, std::string_view needle);

// Appends the UTF-8 encoding of `cp` to *out (tokenizer::AppendUtf8).
void Append(char32_t cp, std::string* out);

bool IsAscii(std::string_view s);

// Number of code points.
size_t Length(std::string_view s);

// Byte offset of every code point start, plus s.size() at the end.
std::vector<size_t> Offsets(std::string_view s);

// Python's str.isspace() for one code point (also what `\s` matches).
bool IsSpace(char32_t cp);

// Line boundaries of Python's str.splitlines() (\r\n is one boundary).
bool IsLineBreak(char32_t cp);

bool IsUpper(char32_t cp);
bool IsLower(char32_t cp);
bool IsAlpha(char32_t cp);
bool IsDigit(char32_t cp);

std::string Upper(std::string_view s);
std::string Lower(std::string_view s);
// Uppercases the first code point and lowercases the rest (str.capitalize()).
std::string Capitalize(std::string_view s);
// Python's str.title(): the first cased letter after an uncased character is
// uppercased, the other cased letters lowercased.
std::string Title(std::string_view s);

enum class StripSide { kLeft, kRight, kBoth };
// Python's str.strip/lstrip/rstrip. Without `chars`, strips whitespace;
// with it, strips any of its code points.
std::string_view Strip(std::string_view s, StripSide side, const std::string_view* chars = nullptr);

// Python's str.splitlines() without keepends.
std::vector<std::string> SplitLines(std::string_view s);

}  // namespace ballast::chat::unicode
