#include "engine/tokenizer/utf8.h"

namespace ballast::tokenizer {

int Utf8SequenceLength(unsigned char b) {
  if (b < 0x80) return 1;
  if (b >= 0xC2 && b <= 0xDF) return 2;
  if (b >= 0xE0 && b <= 0xEF) return 3;
  if (b >= 0xF0 && b <= 0xF4) return 4;
  return 0;
}

bool Utf8ValidContinuation(unsigned char lead, int i, unsigned char c) {
  if (i == 1) {
    if (lead == 0xE0) return c >= 0xA0 && c <= 0xBF;
    if (lead == 0xED) return c >= 0x80 && c <= 0x9F;
    if (lead == 0xF0) return c >= 0x90 && c <= 0xBF;
    if (lead == 0xF4) return c >= 0x80 && c <= 0x8F;
  }
  return c >= 0x80 && c <= 0xBF;
}

namespace {

// Bytes of the valid sequence at s[i], 0 if none. Sets *prefix to the length
// of the maximal valid prefix when there is none (at least 1).
int ValidSequenceAt(std::string_view s, size_t i, int* prefix) {
  const auto lead = static_cast<unsigned char>(s[i]);
  const int len = Utf8SequenceLength(lead);
  if (len == 0) {
    *prefix = 1;
    return 0;
  }
  int k = 1;
  while (k < len && i + k < s.size() &&
         Utf8ValidContinuation(lead, k, static_cast<unsigned char>(s[i + k]))) {
    ++k;
  }
  if (k == len) return len;
  *prefix = k;
  return 0;
}

}  // namespace

bool IsValidUtf8(std::string_view s) {
  size_t i = 0;
  while (i < s.size()) {
    if (static_cast<unsigned char>(s[i]) < 0x80) {
      ++i;
      continue;
    }
    int prefix = 0;
    const int len = ValidSequenceAt(s, i, &prefix);
    if (len == 0) return false;
    i += len;
  }
  return true;
}

bool IsValidUtf8Prefix(std::string_view s) {
  size_t i = 0;
  while (i < s.size()) {
    int prefix = 0;
    const int len = ValidSequenceAt(s, i, &prefix);
    if (len > 0) {
      i += len;
      continue;
    }
    // Only a truncated but so-far valid sequence at the very end is allowed.
    return Utf8SequenceLength(static_cast<unsigned char>(s[i])) > 0 && i + prefix == s.size();
  }
  return true;
}

std::string SanitizeUtf8(std::string_view s) {
  std::string out;
  out.reserve(s.size() + 8);
  size_t i = 0;
  while (i < s.size()) {
    int prefix = 0;
    const int len = ValidSequenceAt(s, i, &prefix);
    if (len > 0) {
      out.append(s.substr(i, len));
      i += len;
    } else {
      out.append(kReplacementChar);
      i += prefix;
    }
  }
  return out;
}

char32_t NextCodePoint(std::string_view s, size_t* pos) {
  const auto b = static_cast<unsigned char>(s[*pos]);
  if (b < 0x80) {
    ++*pos;
    return b;
  }
  const int len = Utf8SequenceLength(b);
  char32_t cp = len == 2 ? (b & 0x1F) : len == 3 ? (b & 0x0F) : (b & 0x07);
  for (int k = 1; k < len && *pos + k < s.size(); ++k) {
    cp = (cp << 6) | (static_cast<unsigned char>(s[*pos + k]) & 0x3F);
  }
  *pos += len > 0 ? len : 1;
  return cp;
}

void AppendUtf8(char32_t cp, std::string* out) {
  if (cp < 0x80) {
    out->push_back(static_cast<char>(cp));
  } else if (cp < 0x800) {
    out->push_back(static_cast<char>(0xC0 | (cp >> 6)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else if (cp < 0x10000) {
    out->push_back(static_cast<char>(0xE0 | (cp >> 12)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else {
    out->push_back(static_cast<char>(0xF0 | (cp >> 18)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 12) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  }
}

std::string Utf8Sanitizer::Push(std::string_view bytes) {
  pending_.append(bytes);
  return Drain(false);
}

std::string Utf8Sanitizer::Finish() { return Drain(true); }

std::string Utf8Sanitizer::Drain(bool final) {
  std::string out;
  size_t i = 0;
  while (i < pending_.size()) {
    int prefix = 0;
    const int len = ValidSequenceAt(pending_, i, &prefix);
    if (len > 0) {
      out.append(pending_, i, len);
      i += len;
    } else if (!final && i + prefix == pending_.size() &&
               Utf8SequenceLength(static_cast<unsigned char>(pending_[i])) > 0) {
      break;  // incomplete so far: wait for more bytes
    } else {
      out.append(kReplacementChar);  // invalid (or truncated at the end)
      i += prefix;
    }
  }
  pending_.erase(0, i);
  return out;
}

}  // namespace ballast::tokenizer
