#include "engine/chat/unicode.h"

#include <string.h>  // memmem (GNU)

#include <algorithm>

#include "engine/tokenizer/utf8.h"

namespace ballast::chat::unicode {
namespace {

// A range of code points whose case partner is at a fixed offset.
struct OffsetRange {
  char32_t first, last;
  int offset;  // lower - upper
};

// Upper-case ranges with the offset to their lower-case partner.
constexpr OffsetRange kUpperRanges[] = {
    {0x41, 0x5A, 32},   {0xC0, 0xD6, 32},   {0xD8, 0xDE, 32},     {0x391, 0x3A1, 32},
    {0x3A3, 0x3AB, 32}, {0x388, 0x38A, 37}, {0x38E, 0x38F, 63},   {0x410, 0x42F, 32},
    {0x400, 0x40F, 80}, {0x531, 0x556, 48}, {0xFF21, 0xFF3A, 32},
};

// Blocks where upper and lower case alternate (upper at the even or odd
// code point of each pair).
struct PairRange {
  char32_t first, last;  // first is the first upper-case letter
};
constexpr PairRange kPairRanges[] = {
    {0x100, 0x12F}, {0x132, 0x137}, {0x139, 0x148},   {0x14A, 0x177},
    {0x179, 0x17E}, {0x1CD, 0x1DC}, {0x1DE, 0x1EF},   {0x1F4, 0x1F5},
    {0x1F8, 0x21F}, {0x222, 0x233}, {0x460, 0x481},   {0x48A, 0x4BF},
    {0x4C1, 0x4CE}, {0x4D0, 0x52F}, {0x1E00, 0x1E95}, {0x1EA0, 0x1EFF},
};

// The Latin digraphs (DŽ Dž dž, LJ Lj lj, NJ Nj nj, DZ Dz dz): upper, title, lower.
constexpr char32_t kDigraphs[] = {0x1C4, 0x1C7, 0x1CA, 0x1F1};

char32_t MapUpper(char32_t cp) {
  if (cp < 0x80) return (cp >= 'a' && cp <= 'z') ? cp - 32 : cp;
  for (char32_t d : kDigraphs) {
    if (cp == d + 1 || cp == d + 2) return d;
  }
  for (const auto& r : kUpperRanges) {
    if (cp >= r.first + r.offset && cp <= r.last + r.offset) return cp - r.offset;
  }
  for (const auto& r : kPairRanges) {
    if (cp > r.first && cp <= r.last && (cp - r.first) % 2 == 1) return cp - 1;
  }
  switch (cp) {
    case 0xFF:
      return 0x178;
    case 0xB5:
      return 0x39C;
    case 0x131:
      return 'I';
    case 0x17F:
      return 'S';
    case 0x3C2:
      return 0x3A3;
    case 0x3AC:
      return 0x386;
    case 0x3CC:
      return 0x38C;
    default:
      return cp;
  }
}

char32_t MapLower(char32_t cp) {
  if (cp < 0x80) return (cp >= 'A' && cp <= 'Z') ? cp + 32 : cp;
  for (char32_t d : kDigraphs) {
    if (cp == d || cp == d + 1) return d + 2;
  }
  for (const auto& r : kUpperRanges) {
    if (cp >= r.first && cp <= r.last) return cp + r.offset;
  }
  for (const auto& r : kPairRanges) {
    if (cp >= r.first && cp < r.last && (cp - r.first) % 2 == 0) return cp + 1;
  }
  switch (cp) {
    case 0x178:
      return 0xFF;
    case 0x386:
      return 0x3AC;
    case 0x38C:
      return 0x3CC;
    default:
      return cp;
  }
}

bool IsCased(char32_t cp) { return IsUpper(cp) || IsLower(cp) || cp == 0xDF; }

// Appends the upper-case form of `cp` (ß expands to SS).
void AppendUpper(char32_t cp, std::string* out) {
  if (cp == 0xDF) {
    out->append("SS");
    return;
  }
  Append(MapUpper(cp), out);
}

// Appends the lower-case form of `cp` (İ expands to i + combining dot).
void AppendLower(char32_t cp, std::string* out) {
  if (cp == 0x130) {
    out->append("i\xCC\x87");
    return;
  }
  Append(MapLower(cp), out);
}

bool InChars(char32_t cp, std::string_view chars) {
  for (size_t i = 0; i < chars.size();) {
    char32_t c;
    i += DecodeAt(chars, i, &c);
    if (c == cp) return true;
  }
  return false;
}

}  // namespace

int DecodeAt(std::string_view s, size_t i, char32_t* cp) {
  const auto b = static_cast<unsigned char>(s[i]);
  int len = 0;
  char32_t v = 0;
  if (b < 0x80) {
    *cp = b;
    return 1;
  } else if (b >= 0xC2 && b <= 0xDF) {
    len = 2, v = b & 0x1F;
  } else if (b >= 0xE0 && b <= 0xEF) {
    len = 3, v = b & 0x0F;
  } else if (b >= 0xF0 && b <= 0xF4) {
    len = 4, v = b & 0x07;
  } else {
    *cp = b;
    return 1;
  }
  if (i + len > s.size()) {
    *cp = b;
    return 1;
  }
  for (int k = 1; k < len; ++k) {
    const auto c = static_cast<unsigned char>(s[i + k]);
    if ((c & 0xC0) != 0x80) {
      *cp = b;
      return 1;
    }
    v = (v << 6) | (c & 0x3F);
  }
  const bool overlong = (len == 3 && v < 0x800) || (len == 4 && v < 0x10000);
  if (overlong || v > 0x10FFFF || (v >= 0xD800 && v <= 0xDFFF)) {
    *cp = b;
    return 1;
  }
  *cp = v;
  return len;
}

bool AppendPlainRun(std::string_view s, char quote, size_t limit, size_t* i, std::string* out) {
  size_t run = *i;
  while (run < s.size() && s[run] >= 0x20 && s[run] < 0x7F && s[run] != quote && s[run] != '\\') {
    ++run;
  }
  if (run == *i) return false;
  if (out->size() <= limit) out->append(s.substr(*i, std::min(run - *i, limit + 1 - out->size())));
  *i = run;
  return true;
}

size_t Find(std::string_view hay, std::string_view needle, size_t from) {
  if (from > hay.size()) return std::string_view::npos;
  const void* hit = memmem(hay.data() + from, hay.size() - from, needle.data(), needle.size());
  if (hit == nullptr) return std::string_view::npos;
  return static_cast<size_t>(static_cast<const char*>(hit) - hay.data());
}

std::string Reversed(std::string_view s) { return std::string(s.rbegin(), s.rend()); }

size_t ReverseFind(std::string_view hay, std::string_view needle) {
  if (needle.size() > hay.size()) return std::string_view::npos;
  const size_t r = Find(Reversed(hay), Reversed(needle));
  return r == std::string_view::npos ? r : hay.size() - r - needle.size();
}

void Append(char32_t cp, std::string* out) { tokenizer::AppendUtf8(cp, out); }

bool IsAscii(std::string_view s) {
  return std::all_of(s.begin(), s.end(),
                     [](char c) { return static_cast<unsigned char>(c) < 0x80; });
}

size_t Length(std::string_view s) {
  size_t n = 0;
  for (size_t i = 0; i < s.size(); ++n) {
    char32_t cp;
    i += DecodeAt(s, i, &cp);
  }
  return n;
}

std::vector<size_t> Offsets(std::string_view s) {
  std::vector<size_t> offsets;
  offsets.reserve(s.size() + 1);
  for (size_t i = 0; i < s.size();) {
    offsets.push_back(i);
    char32_t cp;
    i += DecodeAt(s, i, &cp);
  }
  offsets.push_back(s.size());
  return offsets;
}

bool IsSpace(char32_t cp) {
  if (cp == ' ' || (cp >= 0x09 && cp <= 0x0D) || (cp >= 0x1C && cp <= 0x1F)) return true;
  if (cp < 0x85) return false;
  return cp == 0x85 || cp == 0xA0 || cp == 0x1680 || (cp >= 0x2000 && cp <= 0x200A) ||
         cp == 0x2028 || cp == 0x2029 || cp == 0x202F || cp == 0x205F || cp == 0x3000;
}

bool IsLineBreak(char32_t cp) {
  return cp == '\n' || cp == '\r' || cp == 0x0B || cp == 0x0C || (cp >= 0x1C && cp <= 0x1E) ||
         cp == 0x85 || cp == 0x2028 || cp == 0x2029;
}

bool IsUpper(char32_t cp) { return MapLower(cp) != cp || cp == 0x130; }
bool IsLower(char32_t cp) { return MapUpper(cp) != cp || cp == 0xDF; }
bool IsAlpha(char32_t cp) {
  if (cp < 0x80) return (cp | 32) >= 'a' && (cp | 32) <= 'z';
  // Cased letters, plus the main uncased scripts' letter blocks.
  return IsCased(cp) || (cp >= 0x4E00 && cp <= 0x9FFF) || (cp >= 0x3040 && cp <= 0x30FF) ||
         (cp >= 0xAC00 && cp <= 0xD7A3) || (cp >= 0x0620 && cp <= 0x064A) ||
         (cp >= 0x05D0 && cp <= 0x05EA) || (cp >= 0x0E01 && cp <= 0x0E30);
}
bool IsDigit(char32_t cp) { return (cp >= '0' && cp <= '9') || (cp >= 0xFF10 && cp <= 0xFF19); }

std::string Upper(std::string_view s) {
  std::string out;
  out.reserve(s.size());
  for (size_t i = 0; i < s.size();) {
    char32_t cp;
    const int n = DecodeAt(s, i, &cp);
    if (n == 1 && cp >= 0x80) {
      out.push_back(s[i]);  // invalid byte: copied through
    } else {
      AppendUpper(cp, &out);
    }
    i += n;
  }
  return out;
}

std::string Lower(std::string_view s) {
  std::string out;
  out.reserve(s.size());
  for (size_t i = 0; i < s.size();) {
    char32_t cp;
    const int n = DecodeAt(s, i, &cp);
    if (n == 1 && cp >= 0x80) {
      out.push_back(s[i]);
    } else {
      AppendLower(cp, &out);
    }
    i += n;
  }
  return out;
}

std::string Capitalize(std::string_view s) {
  if (s.empty()) return {};
  char32_t cp;
  const int n = DecodeAt(s, 0, &cp);
  std::string out;
  if (n == 1 && cp >= 0x80) {
    out.push_back(s[0]);
  } else {
    AppendUpper(cp, &out);
  }
  return out + Lower(s.substr(n));
}

std::string Title(std::string_view s) {
  std::string out;
  out.reserve(s.size());
  bool previous_cased = false;
  for (size_t i = 0; i < s.size();) {
    char32_t cp;
    const int n = DecodeAt(s, i, &cp);
    if (n == 1 && cp >= 0x80) {
      out.push_back(s[i]);
      previous_cased = false;
    } else if (previous_cased) {
      AppendLower(cp, &out);
    } else {
      AppendUpper(cp, &out);
    }
    previous_cased = (n > 1 || cp < 0x80) && IsCased(cp);
    i += n;
  }
  return out;
}

std::string_view Strip(std::string_view s, StripSide side, const std::string_view* chars) {
  auto strip_cp = [&](char32_t cp) { return chars ? InChars(cp, *chars) : IsSpace(cp); };
  size_t begin = 0, end = s.size();
  if (side != StripSide::kRight) {
    while (begin < end) {
      char32_t cp;
      const int n = DecodeAt(s, begin, &cp);
      if (!strip_cp(cp)) break;
      begin += n;
    }
  }
  if (side != StripSide::kLeft) {
    while (end > begin) {
      size_t start = end - 1;  // back up to the lead byte of the last code point
      while (start > begin && end - start < 4 &&
             (static_cast<unsigned char>(s[start]) & 0xC0) == 0x80) {
        --start;
      }
      char32_t cp;
      const int n = DecodeAt(s, start, &cp);
      if (start + n != end) start = end - 1, DecodeAt(s, start, &cp);
      if (!strip_cp(cp)) break;
      end = start;
    }
  }
  return s.substr(begin, end - begin);
}

std::vector<std::string> SplitLines(std::string_view s) {
  std::vector<std::string> lines;
  size_t start = 0;
  for (size_t i = 0; i < s.size();) {
    char32_t cp;
    const int n = DecodeAt(s, i, &cp);
    if (IsLineBreak(cp)) {
      lines.emplace_back(s.substr(start, i - start));
      i += n;
      if (cp == '\r' && i < s.size() && s[i] == '\n') ++i;
      start = i;
    } else {
      i += n;
    }
  }
  if (start < s.size()) lines.emplace_back(s.substr(start));
  return lines;
}

}  // namespace ballast::chat::unicode
