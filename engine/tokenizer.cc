#include "engine/tokenizer.h"

namespace ballast::engine {
namespace {

constexpr char kReplacement[] = "\xEF\xBF\xBD";  // U+FFFD

// Length of the UTF-8 sequence led by `b`, or 0 if `b` cannot lead one.
int SequenceLength(unsigned char b) {
  if (b < 0x80) return 1;
  if (b >= 0xC2 && b <= 0xDF) return 2;
  if (b >= 0xE0 && b <= 0xEF) return 3;
  if (b >= 0xF0 && b <= 0xF4) return 4;
  return 0;
}

// Whether `c` may follow at position `i` (1-based) of a sequence led by `lead`.
bool ValidContinuation(unsigned char lead, int i, unsigned char c) {
  if (i == 1) {
    if (lead == 0xE0) return c >= 0xA0 && c <= 0xBF;
    if (lead == 0xED) return c >= 0x80 && c <= 0x9F;
    if (lead == 0xF0) return c >= 0x90 && c <= 0xBF;
    if (lead == 0xF4) return c >= 0x80 && c <= 0x8F;
  }
  return c >= 0x80 && c <= 0xBF;
}

}  // namespace

std::vector<int> ByteTokenizer::Encode(std::string_view text) const {
  std::vector<int> ids;
  ids.reserve(text.size());
  for (unsigned char c : text) ids.push_back(c);
  return ids;
}

std::string ByteTokenizer::TokenBytes(int id) const {
  if (id >= 0 && id < 256) return std::string(1, static_cast<char>(id));
  return {};
}

std::string StreamDecoder::Push(int id) {
  pending_ += tokenizer_->TokenBytes(id);
  return Drain(false);
}

std::string StreamDecoder::Flush() { return Drain(true); }

std::string StreamDecoder::Drain(bool final) {
  std::string out;
  size_t i = 0;
  while (i < pending_.size()) {
    const auto lead = static_cast<unsigned char>(pending_[i]);
    const int len = SequenceLength(lead);
    if (len == 0) {
      out += kReplacement;
      ++i;
      continue;
    }
    int k = 1;
    while (k < len && i + k < pending_.size() &&
           ValidContinuation(lead, k, static_cast<unsigned char>(pending_[i + k]))) {
      ++k;
    }
    if (k == len) {
      out.append(pending_, i, len);
      i += len;
    } else if (i + k == pending_.size() && !final) {
      break;  // incomplete so far: wait for more bytes
    } else {
      out += kReplacement;  // invalid (or truncated at the end): drop the prefix
      i += k;
    }
  }
  pending_.erase(0, i);
  return out;
}

}  // namespace ballast::engine
