// Python's json.dumps for interpreter values (HF's tojson filter).
#include <algorithm>
#include <cmath>

#include "absl/status/status.h"
#include "engine/chat/builtins.h"
#include "engine/chat/unicode.h"

namespace ballast::chat {
namespace {

// The most JSON text one tojson call writes (a tools schema is a few KiB),
// and the most values it encodes: a value that shares its parts (2^24
// leaves from 24 doublings) reached 16 MiB only after some 3,000,000 values.
constexpr size_t kMaxJsonBytes = size_t{16} << 20;
constexpr int64_t kMaxJsonValues = int64_t{1} << 20;

// The error once the JSON text passes kMaxJsonBytes.
absl::Status TooLong() {
  return absl::ResourceExhaustedError("tojson: the JSON text exceeds 16 MiB");
}

void AppendU(unsigned v, std::string* out) {
  static constexpr char kHex[] = "0123456789abcdef";
  const char buf[6] = {
      '\\', 'u', kHex[(v >> 12) & 0xF], kHex[(v >> 8) & 0xF], kHex[(v >> 4) & 0xF], kHex[v & 0xF]};
  out->append(buf, sizeof(buf));
}

// json's encode_basestring(_ascii): escapes '"', '\\' and control
// characters; with ensure_ascii every non-ASCII code point as \uXXXX
// (surrogate pairs above U+FFFF). Stops once `out` passes kMaxJsonBytes
// (the caller then fails).
void AppendString(std::string_view s, bool ensure_ascii, std::string* out) {
  out->push_back('"');
  for (size_t i = 0; i < s.size() && out->size() <= kMaxJsonBytes;) {
    if (unicode::AppendPlainRun(s, '"', kMaxJsonBytes, &i, out)) continue;
    char32_t cp;
    const int n = unicode::DecodeAt(s, i, &cp);
    switch (cp) {
      case '"':
        out->append("\\\"");
        break;
      case '\\':
        out->append("\\\\");
        break;
      case '\n':
        out->append("\\n");
        break;
      case '\r':
        out->append("\\r");
        break;
      case '\t':
        out->append("\\t");
        break;
      case '\b':
        out->append("\\b");
        break;
      case '\f':
        out->append("\\f");
        break;
      default:
        if (cp < 0x20) {
          AppendU(cp, out);
        } else if (ensure_ascii && cp >= 0x80) {
          if (cp >= 0x10000) {
            const char32_t v = cp - 0x10000;
            AppendU(0xD800 | (v >> 10), out);
            AppendU(0xDC00 | (v & 0x3FF), out);
          } else {
            AppendU(cp, out);
          }
        } else {
          out->append(s.substr(i, n));
        }
    }
    i += n;
  }
  out->push_back('"');
}

std::string FloatJson(double d) {
  if (std::isnan(d)) return "NaN";
  if (std::isinf(d)) return d > 0 ? "Infinity" : "-Infinity";
  return FloatRepr(d);
}

class Encoder {
 public:
  explicit Encoder(const JsonOptions& o) : o_(o) {}

  absl::Status Encode(const Value& v, int depth, std::string* out);

 private:
  void Newline(int depth, std::string* out) const {
    out->push_back('\n');
    for (int i = 0; i < depth; ++i) out->append(*o_.indent);
  }
  absl::Status EncodeList(const ValueList& items, int depth, std::string* out);
  absl::Status EncodeDict(const ValueDict& dict, int depth, std::string* out);

  const JsonOptions& o_;
  int64_t values_ = 0;
};

absl::Status Encoder::Encode(const Value& v, int depth, std::string* out) {
  if (depth > 512) return absl::InvalidArgumentError("RecursionError: value nested too deeply");
  // Every value appends at least one byte, so this also bounds the work on
  // a value that shares its parts (2^40 values from 40 doublings).
  if (out->size() > kMaxJsonBytes) return TooLong();
  if (++values_ > kMaxJsonValues) {
    return absl::ResourceExhaustedError("tojson: more than 1,048,576 values");
  }
  switch (v.kind()) {
    case Value::Kind::kNone:
      out->append("null");
      return absl::OkStatus();
    case Value::Kind::kBool:
      out->append(v.AsBool() ? "true" : "false");
      return absl::OkStatus();
    case Value::Kind::kInt:
      out->append(std::to_string(v.AsInt()));
      return absl::OkStatus();
    case Value::Kind::kFloat:
      out->append(FloatJson(v.AsDouble()));
      return absl::OkStatus();
    case Value::Kind::kString:
      AppendString(v.AsString(), o_.ensure_ascii, out);
      return absl::OkStatus();
    case Value::Kind::kList:
    case Value::Kind::kTuple:
      return EncodeList(v.AsList(), depth, out);
    case Value::Kind::kDict:
      return EncodeDict(v.AsDict(), depth, out);
    default:
      return TypeErrorStatus(Cat("Object of type ", v.TypeName(), " is not JSON serializable"));
  }
}

absl::Status Encoder::EncodeList(const ValueList& items, int depth, std::string* out) {
  if (items.empty()) {
    out->append("[]");
    return absl::OkStatus();
  }
  out->push_back('[');
  for (size_t i = 0; i < items.size(); ++i) {
    if (i > 0) out->append(o_.item_separator);
    if (o_.indent) Newline(depth + 1, out);
    if (auto st = Encode(items[i], depth + 1, out); !st.ok()) return st;
  }
  if (o_.indent) Newline(depth, out);
  out->push_back(']');
  return absl::OkStatus();
}

absl::Status Encoder::EncodeDict(const ValueDict& dict, int depth, std::string* out) {
  if (dict.items.empty()) {
    out->append("{}");
    return absl::OkStatus();
  }
  // Keys become strings as json does: str as is, numbers/bools/None spelled.
  std::vector<std::pair<std::string, const Value*>> items;
  for (const auto& [k, v] : dict.items) {
    std::string key;
    switch (k.kind()) {
      case Value::Kind::kString:
        key = k.AsString();
        break;
      case Value::Kind::kNone:
        key = "null";
        break;
      case Value::Kind::kBool:
        key = k.AsBool() ? "true" : "false";
        break;
      case Value::Kind::kInt:
        key = std::to_string(k.AsInt());
        break;
      case Value::Kind::kFloat:
        key = FloatJson(k.AsDouble());
        break;
      default:
        return TypeErrorStatus(
            Cat("keys must be str, int, float, bool or None, not ", k.TypeName()));
    }
    items.emplace_back(std::move(key), &v);
  }
  if (o_.sort_keys) {
    std::stable_sort(items.begin(), items.end(),
                     [](const auto& a, const auto& b) { return a.first < b.first; });
  }
  out->push_back('{');
  for (size_t i = 0; i < items.size(); ++i) {
    if (i > 0) out->append(o_.item_separator);
    if (o_.indent) Newline(depth + 1, out);
    AppendString(items[i].first, o_.ensure_ascii, out);
    out->append(o_.key_separator);
    if (auto st = Encode(*items[i].second, depth + 1, out); !st.ok()) return st;
  }
  if (o_.indent) Newline(depth, out);
  out->push_back('}');
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::string> ToJson(const Value& v, const JsonOptions& options) {
  std::string out;
  if (auto st = Encoder(options).Encode(v, 0, &out); !st.ok()) return st;
  if (out.size() > kMaxJsonBytes) return TooLong();
  return out;
}

}  // namespace ballast::chat
