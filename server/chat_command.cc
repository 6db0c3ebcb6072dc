#include "server/chat_command.h"

#include <grpcpp/grpcpp.h>

#include <iostream>

#include "absl/random/random.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/strip.h"
#include "ballast/v1/inference.grpc.pb.h"
#include "server/client_commands.h"
#include "server/status_util.h"

namespace ballast::server {
namespace {

std::string NewSessionId() {
  absl::BitGen gen;
  return absl::StrCat("chat-", absl::Hex(absl::Uniform<uint64_t>(gen), absl::kZeroPad16));
}

v1::SamplingParams Sampling(const ChatFlags& f) {
  v1::SamplingParams s;
  s.set_max_tokens(f.max_tokens);
  s.set_temperature(f.temperature);
  s.set_top_p(f.top_p);
  s.set_top_k(f.top_k);
  s.set_min_p(f.min_p);
  s.set_presence_penalty(f.presence_penalty);
  s.set_frequency_penalty(f.frequency_penalty);
  s.set_repetition_penalty(f.repetition_penalty);
  if (f.seed) s.set_seed(*f.seed);
  s.set_ignore_eos(f.ignore_eos);
  return s;
}

void PrintStats(const v1::Final& f, std::ostream& err) {
  err << absl::StrFormat(
      "[prompt %d tokens, %d cached; %d generated, %s; ttft %.1f ms, tpot %.2f ms]\n",
      f.usage().prompt_tokens(), f.usage().cached_prompt_tokens(), f.usage().completion_tokens(),
      v1::FinishReason_Name(f.finish_reason()), f.timings().ttft_ms(), f.timings().mean_tpot_ms());
}

// One turn: streams the reply to `out`. The returned status is the RPC's.
grpc::Status Turn(v1::Inference::Stub* stub, const ChatFlags& f, const std::string& session,
                  bool first, const std::string& line, std::ostream& out, std::ostream& err) {
  v1::GenerateRequest req;
  req.set_model(f.model);
  req.set_session_id(session);
  if (first && !f.system.empty()) {
    v1::ChatMessage* sys = req.add_messages();
    sys->set_role("system");
    sys->set_content(f.system);
  }
  v1::ChatMessage* user = req.add_messages();
  user->set_role("user");
  user->set_content(line);
  *req.mutable_sampling() = Sampling(f);
  std::optional<v1::Final> final;
  const grpc::Status st = StreamGenerate(stub, req, out, &final);
  out << "\n" << std::flush;
  if (st.ok() && f.stats && final) PrintStats(*final, err);
  return st;
}

void EndSession(v1::Inference::Stub* stub, const std::string& session) {
  v1::EndSessionRequest req;
  req.set_session_id(session);
  v1::EndSessionResponse resp;
  grpc::ClientContext ctx;
  AddApiKey(&ctx);
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
  stub->EndSession(&ctx, req, &resp);  // best effort: the server forgets idle sessions anyway
}

}  // namespace

int RunChat(const ChatFlags& f, std::istream& in, std::ostream& out, std::ostream& err,
            bool interactive) {
  auto stub = v1::Inference::NewStub(grpc::CreateChannel(f.target, ClientCredentials()));
  std::string session = NewSessionId();
  bool first = true;
  if (interactive) {
    err << "chatting with " << f.model << " on " << f.target
        << " (/reset starts over, /exit or Ctrl-D leaves)\n";
  }
  int rc = 0;
  std::string line;
  while (true) {
    if (interactive) err << "> " << std::flush;
    if (!std::getline(in, line)) break;
    const absl::string_view text = absl::StripAsciiWhitespace(line);
    if (text.empty()) continue;
    if (text == "/exit" || text == "/quit") break;
    if (text == "/reset") {
      if (!first) EndSession(stub.get(), session);
      session = NewSessionId();
      first = true;
      continue;
    }
    const grpc::Status st = Turn(stub.get(), f, session, first, line, out, err);
    if (!st.ok()) {
      err << "error: " << CodeName(st.error_code()) << ": " << st.error_message() << "\n";
      rc = st.error_code() == grpc::StatusCode::UNAVAILABLE ? 3 : 2;
      // A failed first turn leaves no conversation; a later one leaves it
      // as it was. Interactive users may go on; scripts stop here.
      if (!interactive) break;
      continue;
    }
    first = false;
  }
  if (!first) EndSession(stub.get(), session);
  return rc;
}

}  // namespace ballast::server
