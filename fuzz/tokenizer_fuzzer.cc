// libFuzzer target: tokenizer.json (engine/tokenizer/hf_tokenizer.h). The
// input is a tokenizer.json, then optionally a NUL byte and a text: a
// tokenizer that loads encodes the text (or a fixed one) and decodes the
// ids back. Loading must return a status; encoding and decoding must not
// crash, hang or read out of bounds, whatever the vocabulary and rules.
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "engine/tokenizer/hf_tokenizer.h"
#include "nlohmann/json.hpp"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view in(reinterpret_cast<const char*>(data), size);
  const size_t nul = in.find('\0');
  const std::string_view json_text = in.substr(0, nul);
  const std::string_view text =
      nul == std::string_view::npos
          ? std::string_view("Hello, world! 123 h\xc3\xa9llo \xf0\x9f\x99\x82")
          : in.substr(nul + 1);
  const nlohmann::json j = nlohmann::json::parse(json_text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) return 0;
  auto tok = ballast::tokenizer::HfTokenizer::FromJson(j, nlohmann::json(), nlohmann::json(),
                                                       nlohmann::json(), "/fuzz");
  if (!tok.ok()) return 0;
  const std::vector<int> ids = (*tok)->Encode(text);
  (void)(*tok)->Decode(ids, /*skip_special_tokens=*/false);
  (void)(*tok)->Decode(ids, /*skip_special_tokens=*/true);
  return 0;
}
