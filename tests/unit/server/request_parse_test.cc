// Requests gRPC's codec would refuse with INTERNAL and no message (invalid
// UTF-8 in a proto3 string field) are refused INVALID_ARGUMENT naming the
// field: the path finder on nested and repeated fields, and the scheduler's
// real Generate on a gRPC server, which keeps serving afterwards.
#include "server/request_parse.h"

#include <grpcpp/grpcpp.h>

#include "absl/strings/str_cat.h"
#include "ballast/v1/inference.grpc.pb.h"
#include "global_scheduler/scheduler.h"
#include "gtest/gtest.h"
#include "server/grpc_errors.h"
#include "server/scheduler_service.h"

namespace ballast::server {
namespace {

const std::string kBad = "bad \xff\xfe bytes";

std::string Serialized(const v1::GenerateRequest& r) {
  std::string s;
  r.SerializeToString(&s);  // C++ serializes invalid UTF-8 (and logs it)
  return s;
}

TEST(RequestParse, FindsTheInvalidStringFieldsPath) {
  const auto* type = v1::GenerateRequest::descriptor();
  v1::GenerateRequest r;
  r.set_model("m");
  r.set_prompt("fine");
  EXPECT_EQ(FirstInvalidUtf8Field(Serialized(r), type), "");
  r.set_session_id(kBad);
  EXPECT_EQ(FirstInvalidUtf8Field(Serialized(r), type), "session_id");
  r.set_session_id("s");
  r.clear_prompt();
  r.add_messages()->set_content("ok");
  auto* m = r.add_messages();
  m->set_role("user");
  m->set_content(kBad);
  EXPECT_EQ(FirstInvalidUtf8Field(Serialized(r), type), "messages[1].content");
  m->set_content("ok");
  r.mutable_sampling()->add_stop(kBad);
  EXPECT_EQ(FirstInvalidUtf8Field(Serialized(r), type), "sampling.stop[0]");
}

TEST(RequestParse, RefusesWithTheFieldOrAsMalformed) {
  v1::GenerateRequest r;
  r.set_model("m");
  r.set_prompt(kBad);
  grpc::Slice slice(Serialized(r));
  grpc::ByteBuffer bad(&slice, 1);
  v1::GenerateRequest out;
  absl::Status st = ParseRequest(bad, &out);
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(st.message().find("GenerateRequest.prompt: not valid UTF-8"), std::string::npos)
      << st.message();
  grpc::Slice junk(std::string("\x0a\xff\xff\xff", 4));  // a length past the end
  grpc::ByteBuffer malformed(&junk, 1);
  st = ParseRequest(malformed, &out);
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(st.message().find("not a valid ballast.v1.GenerateRequest"), std::string::npos)
      << st.message();
  r.set_prompt("fine");
  grpc::Slice good_slice(Serialized(r));
  grpc::ByteBuffer good(&good_slice, 1);
  ASSERT_TRUE(ParseRequest(good, &out).ok());
  EXPECT_EQ(out.prompt(), "fine");
}

// The scheduler's Generate (a raw method): INVALID_ARGUMENT naming the
// field; a valid request for an unknown model still reaches routing
// (NOT_FOUND), before and after.
TEST(RequestParse, TheSchedulersGenerateRefusesInvalidUtf8ByField) {
  global_scheduler::SchedulerOptions o;
  auto sched = *global_scheduler::Scheduler::Create(o);
  Metrics metrics;
  InferenceService service(sched.get(), &metrics);
  grpc::ServerBuilder b;
  InstallRequestErrors(&b);
  int port = 0;
  b.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port);
  b.RegisterService(&service);
  auto server = b.BuildAndStart();
  ASSERT_TRUE(server != nullptr);
  auto stub = v1::Inference::NewStub(
      grpc::CreateChannel(absl::StrCat("127.0.0.1:", port), grpc::InsecureChannelCredentials()));
  auto call = [&](const v1::GenerateRequest& req) {
    grpc::ClientContext ctx;
    auto reader = stub->Generate(&ctx, req);
    v1::GenerateResponse resp;
    while (reader->Read(&resp)) {
    }
    return reader->Finish();
  };
  v1::GenerateRequest good;
  good.set_model("nope");
  good.set_prompt("fine");
  EXPECT_EQ(call(good).error_code(), grpc::StatusCode::NOT_FOUND);
  v1::GenerateRequest bad = good;
  bad.clear_prompt();
  bad.add_messages()->set_role("user");
  bad.mutable_messages(0)->set_content(kBad);
  for (int i = 0; i < 5; ++i) {
    const grpc::Status st = call(bad);
    EXPECT_EQ(st.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
    EXPECT_NE(st.error_message().find("GenerateRequest.messages[0].content: not valid UTF-8"),
              std::string::npos)
        << st.error_message();
  }
  EXPECT_EQ(call(good).error_code(), grpc::StatusCode::NOT_FOUND);  // still serving
  server->Shutdown();
  sched->Stop();
}

}  // namespace
}  // namespace ballast::server
