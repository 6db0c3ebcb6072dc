#include "server/request_parse.h"

#include <map>
#include <vector>

#include "absl/strings/str_cat.h"
#include "engine/tokenizer/utf8.h"
#include "google/protobuf/unknown_field_set.h"

namespace ballast::server {
namespace {

using google::protobuf::Descriptor;
using google::protobuf::FieldDescriptor;
using google::protobuf::UnknownField;
using google::protobuf::UnknownFieldSet;

std::string Walk(std::string_view bytes, const Descriptor* type, int depth) {
  UnknownFieldSet fields;
  if (depth > 32 || !fields.ParseFromArray(bytes.data(), static_cast<int>(bytes.size()))) return "";
  std::map<int, int> seen;  // field number -> occurrences so far (repeated index)
  for (int i = 0; i < fields.field_count(); ++i) {
    const UnknownField& u = fields.field(i);
    const int index = seen[u.number()]++;
    const FieldDescriptor* f = type->FindFieldByNumber(u.number());
    if (!f || u.type() != UnknownField::TYPE_LENGTH_DELIMITED) continue;
    const std::string name =
        f->is_repeated() ? absl::StrCat(f->name(), "[", index, "]") : std::string(f->name());
    if (f->type() == FieldDescriptor::TYPE_STRING) {
      if (!tokenizer::IsValidUtf8(u.length_delimited())) return name;
    } else if (f->type() == FieldDescriptor::TYPE_MESSAGE) {
      const std::string inner = Walk(u.length_delimited(), f->message_type(), depth + 1);
      if (!inner.empty()) return absl::StrCat(name, ".", inner);
    }
  }
  return "";
}

}  // namespace

std::string FirstInvalidUtf8Field(std::string_view bytes, const Descriptor* type) {
  return Walk(bytes, type, 0);
}

absl::Status ParseRequest(const grpc::ByteBuffer& buffer, google::protobuf::Message* msg) {
  std::vector<grpc::Slice> slices;
  if (!buffer.Dump(&slices).ok()) return absl::InvalidArgumentError("unreadable request");
  std::string bytes;
  for (const grpc::Slice& s : slices)
    bytes.append(reinterpret_cast<const char*>(s.begin()), s.size());
  if (msg->ParseFromString(bytes)) return absl::OkStatus();
  const Descriptor* type = msg->GetDescriptor();
  const std::string field = FirstInvalidUtf8Field(bytes, type);
  if (!field.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat(type->name(), ".", field,
                     ": not valid UTF-8 (string fields must be UTF-8 text; encode binary data, "
                     "e.g. as base64)"));
  }
  return absl::InvalidArgumentError(
      absl::StrCat("the request is not a valid ", type->full_name(), " (malformed protobuf)"));
}

}  // namespace ballast::server
