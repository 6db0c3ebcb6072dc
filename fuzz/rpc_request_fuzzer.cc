// libFuzzer target: the request message of every RPC a Ballast port serves
// (Inference, Admin, NodeRegistry, Node), as the servers parse it: the
// first byte picks the method, the rest is the serialized request, parsed by
// server::ParseRequest (invalid UTF-8 named by field) and, for Generate, run
// through the scheduler's validation. Nothing may crash or read out of
// bounds, whatever the bytes.
#include <grpcpp/grpcpp.h>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "ballast/v1/admin.pb.h"
#include "ballast/v1/inference.pb.h"
#include "ballast/v1/node.pb.h"
#include "global_scheduler/request_validation.h"
#include "google/protobuf/descriptor.h"
#include "google/protobuf/message.h"
#include "server/request_parse.h"

namespace {

// The request types of every method of the served services.
std::vector<const google::protobuf::Descriptor*> RequestTypes() {
  // Linking the generated files registers them in the generated pool.
  (void)ballast::v1::GenerateRequest::descriptor();
  (void)ballast::v1::RegisterModelRequest::descriptor();
  (void)ballast::v1::HeartbeatRequest::descriptor();
  std::vector<const google::protobuf::Descriptor*> out;
  const auto* pool = google::protobuf::DescriptorPool::generated_pool();
  for (const char* s :
       {"ballast.v1.Inference", "ballast.v1.Admin", "ballast.v1.NodeRegistry", "ballast.v1.Node"}) {
    const google::protobuf::ServiceDescriptor* svc = pool->FindServiceByName(s);
    if (svc == nullptr) __builtin_trap();  // a renamed service: fix the list
    for (int i = 0; i < svc->method_count(); ++i) out.push_back(svc->method(i)->input_type());
  }
  return out;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const std::vector<const google::protobuf::Descriptor*> types = RequestTypes();
  if (size == 0) return 0;
  const google::protobuf::Descriptor* type = types[data[0] % types.size()];
  std::unique_ptr<google::protobuf::Message> msg(
      google::protobuf::MessageFactory::generated_factory()->GetPrototype(type)->New());
  grpc::Slice slice(data + 1, size - 1);
  grpc::ByteBuffer buffer(&slice, 1);
  if (!ballast::server::ParseRequest(buffer, msg.get()).ok()) return 0;
  if (auto* g = dynamic_cast<ballast::v1::GenerateRequest*>(msg.get())) {
    (void)ballast::global_scheduler::ValidateGenerateRequest(*g, 4096);
    (void)ballast::global_scheduler::ValidateSessionId(g->session_id());
    (void)ballast::global_scheduler::ValidateTenant(g->tenant());
  }
  return 0;
}
