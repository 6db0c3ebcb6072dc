// A request with invalid UTF-8 in a string field fails (gRPC's INTERNAL),
// the server keeps serving, and protobuf's log line is written once, not
// once per request.
#include "server/grpc_errors.h"

#include <grpcpp/grpcpp.h>

#include "absl/strings/str_cat.h"
#include "ballast/v1/inference.grpc.pb.h"
#include "gtest/gtest.h"

namespace ballast::server {
namespace {

TEST(RequestErrors, InvalidUtf8FailsAndIsLoggedOnce) {
  v1::Inference::Service service;  // every method UNIMPLEMENTED after parsing
  grpc::ServerBuilder b;
  InstallRequestErrors(&b);
  int port = 0;
  b.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port);
  b.RegisterService(&service);
  auto server = b.BuildAndStart();
  ASSERT_TRUE(server != nullptr);
  ASSERT_NE(port, 0);
  auto stub = v1::Inference::NewStub(
      grpc::CreateChannel(absl::StrCat("127.0.0.1:", port), grpc::InsecureChannelCredentials()));

  v1::GenerateRequest good;
  good.set_model("m");
  good.set_prompt("fine");
  {
    grpc::ClientContext ctx;
    auto reader = stub->Generate(&ctx, good);
    v1::GenerateResponse resp;
    while (reader->Read(&resp)) {
    }
    EXPECT_EQ(reader->Finish().error_code(), grpc::StatusCode::UNIMPLEMENTED);
  }
  v1::GenerateRequest bad = good;
  bad.set_prompt(std::string("bad \xff\xfe bytes"));
  const int64_t lines_before = ProtobufLogLinesWritten();
  for (int i = 0; i < 20; ++i) {
    grpc::ClientContext ctx;
    auto reader = stub->Generate(&ctx, bad);
    v1::GenerateResponse resp;
    while (reader->Read(&resp)) {
    }
    const grpc::Status st = reader->Finish();
    EXPECT_EQ(st.error_code(), grpc::StatusCode::INTERNAL) << st.error_message();
  }
  // One line for the client's serialization, one for the server's parse.
  EXPECT_LE(ProtobufLogLinesWritten() - lines_before, 2);
  {
    grpc::ClientContext ctx;  // still serving
    auto reader = stub->Generate(&ctx, good);
    v1::GenerateResponse resp;
    while (reader->Read(&resp)) {
    }
    EXPECT_EQ(reader->Finish().error_code(), grpc::StatusCode::UNIMPLEMENTED);
  }
  server->Shutdown();
}

}  // namespace
}  // namespace ballast::server
