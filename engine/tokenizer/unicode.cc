#include "engine/tokenizer/unicode.h"

#include <unicode/bytestream.h>
#include <unicode/normalizer2.h>
#include <unicode/uchar.h>
#include <unicode/ustring.h>

#include "absl/strings/str_cat.h"
#include "engine/tokenizer/utf8.h"

namespace ballast::tokenizer {

bool IsWhitespace(char32_t cp) {
  if (cp < 0x80) return cp == ' ' || (cp >= 0x09 && cp <= 0x0D);
  return u_hasBinaryProperty(static_cast<UChar32>(cp), UCHAR_WHITE_SPACE);
}

bool IsNumeric(char32_t cp) {
  if (cp < 0x80) return cp >= '0' && cp <= '9';
  return (U_GET_GC_MASK(static_cast<UChar32>(cp)) & U_GC_N_MASK) != 0;
}

bool IsPunctuation(char32_t cp) {
  if (cp < 0x80) {
    return (cp >= 0x21 && cp <= 0x2F) || (cp >= 0x3A && cp <= 0x40) || (cp >= 0x5B && cp <= 0x60) ||
           (cp >= 0x7B && cp <= 0x7E);
  }
  return (U_GET_GC_MASK(static_cast<UChar32>(cp)) & U_GC_P_MASK) != 0;
}

bool IsWordChar(char32_t cp) {
  if (cp < 0x80) {
    return (cp >= '0' && cp <= '9') || (cp >= 'a' && cp <= 'z') || (cp >= 'A' && cp <= 'Z') ||
           cp == '_';
  }
  const auto c = static_cast<UChar32>(cp);
  const uint32_t mask = U_GET_GC_MASK(c);
  return u_hasBinaryProperty(c, UCHAR_ALPHABETIC) || (mask & U_GC_M_MASK) != 0 ||
         (mask & (U_GC_ND_MASK | U_GC_PC_MASK)) != 0 || u_hasBinaryProperty(c, UCHAR_JOIN_CONTROL);
}

bool IsNonspacingMark(char32_t cp) {
  return cp >= 0x80 && u_charType(static_cast<UChar32>(cp)) == U_NON_SPACING_MARK;
}

namespace {

bool IsAscii(std::string_view s) {
  for (char c : s) {
    if (static_cast<unsigned char>(c) >= 0x80) return false;
  }
  return true;
}

const icu::Normalizer2* Instance(NormalForm form, UErrorCode* status) {
  switch (form) {
    case NormalForm::kNfc:
      return icu::Normalizer2::getNFCInstance(*status);
    case NormalForm::kNfd:
      return icu::Normalizer2::getNFDInstance(*status);
    case NormalForm::kNfkc:
      return icu::Normalizer2::getNFKCInstance(*status);
    case NormalForm::kNfkd:
      return icu::Normalizer2::getNFKDInstance(*status);
  }
  return nullptr;
}

}  // namespace

absl::Status Normalize(NormalForm form, std::string* s) {
  if (IsAscii(*s)) return absl::OkStatus();  // ASCII is invariant under every form
  UErrorCode status = U_ZERO_ERROR;
  const icu::Normalizer2* n = Instance(form, &status);
  if (U_FAILURE(status) || n == nullptr) {
    return absl::InternalError(absl::StrCat("ICU normalizer: ", u_errorName(status)));
  }
  const icu::StringPiece in(s->data(), static_cast<int32_t>(s->size()));
  if (n->isNormalizedUTF8(in, status) && U_SUCCESS(status)) return absl::OkStatus();
  status = U_ZERO_ERROR;
  std::string out;
  out.reserve(s->size() + 16);
  icu::StringByteSink<std::string> sink(&out);
  n->normalizeUTF8(0, in, sink, nullptr, status);
  if (U_FAILURE(status)) {
    return absl::InternalError(absl::StrCat("ICU normalization failed: ", u_errorName(status)));
  }
  *s = std::move(out);
  return absl::OkStatus();
}

void LowercaseEachChar(std::string* s) {
  std::string out;
  out.reserve(s->size());
  size_t pos = 0;
  while (pos < s->size()) {
    const char32_t cp = NextCodePoint(*s, &pos);
    if (cp < 0x80) {
      out.push_back(static_cast<char>(cp >= 'A' && cp <= 'Z' ? cp + 32 : cp));
      continue;
    }
    UChar src[2];
    int32_t src_len = 0;
    U16_APPEND_UNSAFE(src, src_len, static_cast<UChar32>(cp));
    UChar dst[8];
    UErrorCode status = U_ZERO_ERROR;
    const int32_t n = u_strToLower(dst, 8, src, src_len, "", &status);
    if (U_FAILURE(status)) {
      AppendUtf8(cp, &out);
      continue;
    }
    for (int32_t i = 0; i < n;) {
      UChar32 c;
      U16_NEXT_UNSAFE(dst, i, c);
      AppendUtf8(static_cast<char32_t>(c), &out);
    }
  }
  *s = std::move(out);
}

}  // namespace ballast::tokenizer
