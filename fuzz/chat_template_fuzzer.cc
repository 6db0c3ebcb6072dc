// libFuzzer target: a chat template (engine/chat/chat_template.h). The
// input is the Jinja source; a template that parses is applied to a fixed
// conversation. Both must return a status, bounded in time and memory (the
// evaluator's output, range, recursion, step and size limits), never
// crash. The render gets 20,000 steps, not the server's 1,000,000: this
// build (ASan, coverage) runs some thirty times slower than a release one,
// and the full budget of per-character work would pass the fuzzer's 10 s
// per input (a CI run found such a template). The limits' code is the same
// whatever the budget; chat_jinja_test checks the server's.
#include <cstddef>
#include <cstdint>
#include <string>

#include "engine/chat/chat_template.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using nlohmann::ordered_json;
  auto t = ballast::chat::ChatTemplate::Create(
      std::string(reinterpret_cast<const char*>(data), size),
      ordered_json{{"bos_token", "<s>"}, {"eos_token", "</s>"}});
  if (!t.ok()) return 0;
  ballast::chat::ChatRequest r;
  r.messages = ordered_json::parse(R"([
    {"role": "system", "content": "Be brief."},
    {"role": "user", "content": [{"type": "text", "text": "Hi"}]},
    {"role": "assistant", "content": "Hello.", "tool_calls": [{"function": {"name": "f", "arguments": {"x": 1}}}]},
    {"role": "user", "content": "Bye"}])");
  r.add_generation_prompt = true;
  r.tools =
      ordered_json::parse(R"([{"type": "function", "function": {"name": "f", "parameters": {}}}])");
  (void)(*t)->Apply(r, ballast::chat::RenderLimits{.max_steps = 20'000});
  return 0;
}
