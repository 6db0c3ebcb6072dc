// tokenizer_bench: single-thread encode speed of HfTokenizer, measured the
// way tests/data/tokenizers/make_golden.py measures Hugging Face tokenizers
// (time_encode), so the two figures compare (on the same machine only):
//   entries:  every corpus entry encoded in turn, repeated for --seconds;
//   document: the entries joined by "\n", times 20, encoded whole (best of 5).
// Also the load time of each tokenizer directory.
// Usage: tokenizer_bench [--seconds S] DIR...   (DIR: a checkpoint or
// tokenizer directory with tokenizer.json)
#include <chrono>
#include <cstdlib>
#include <fstream>
#include <iostream>
#include <sstream>
#include <string>
#include <vector>

#include "engine/tokenizer/hf_tokenizer.h"
#include "engine/tokenizer/utf8.h"
#include "nlohmann/json.hpp"

namespace {

using Clock = std::chrono::steady_clock;

double Seconds(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}

std::vector<std::string> CorpusTexts() {
  std::ifstream in(std::string(BALLAST_SOURCE_DIR) + "/tests/data/tokenizers/corpus.json");
  std::stringstream buf;
  buf << in.rdbuf();
  const nlohmann::json corpus = nlohmann::json::parse(buf.str());
  std::vector<std::string> texts;
  for (const auto& e : corpus["entries"]) {
    if (e.contains("text")) {
      texts.push_back(e["text"].get<std::string>());
      continue;
    }
    std::string bytes;
    const std::string hex = e["hex"].get<std::string>();
    for (size_t i = 0; i + 1 < hex.size(); i += 2) {
      bytes.push_back(static_cast<char>(std::stoi(hex.substr(i, 2), nullptr, 16)));
    }
    texts.push_back(ballast::tokenizer::SanitizeUtf8(bytes));  // as the Python side reads it
  }
  return texts;
}

void Bench(const std::string& dir, const std::vector<std::string>& texts, double seconds) {
  const auto t0 = Clock::now();
  auto tok = ballast::tokenizer::HfTokenizer::Load(dir);
  const auto t1 = Clock::now();
  if (!tok.ok()) {
    std::cerr << tok.status() << "\n";
    std::exit(1);
  }
  size_t tokens_per_rep = 0, bytes_per_rep = 0;
  for (const auto& t : texts) {
    tokens_per_rep += (*tok)->Encode(t).size();
    bytes_per_rep += t.size();
  }
  int reps = 0;
  const auto s0 = Clock::now();
  while (Seconds(s0, Clock::now()) < seconds) {
    for (const auto& t : texts) (*tok)->Encode(t);
    ++reps;
  }
  const double dt = Seconds(s0, Clock::now());
  std::string doc;
  for (size_t i = 0; i < texts.size(); ++i) doc += (i ? "\n" : "") + texts[i];
  std::string big;
  for (int i = 0; i < 20; ++i) big += doc;
  const size_t big_tokens = (*tok)->Encode(big).size();
  double best = 1e9;
  for (int i = 0; i < 5; ++i) {
    const auto b0 = Clock::now();
    (*tok)->Encode(big);
    best = std::min(best, Seconds(b0, Clock::now()));
  }
  std::cout << dir << ": load " << Seconds(t0, t1) << " s; entries " << tokens_per_rep * reps / dt
            << " tokens/s (" << bytes_per_rep * reps / dt / 1e6 << " MB/s, " << reps
            << " reps); document " << big.size() << " bytes, " << big_tokens << " tokens, "
            << big_tokens / best << " tokens/s (best of 5: " << best * 1e3 << " ms)\n";
}

}  // namespace

int main(int argc, char** argv) {
  double seconds = 3.0;
  std::vector<std::string> dirs;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--seconds" && i + 1 < argc) {
      seconds = std::atof(argv[++i]);
    } else {
      dirs.push_back(a);
    }
  }
  if (dirs.empty()) {
    std::cerr << "usage: tokenizer_bench [--seconds S] DIR...\n";
    return 2;
  }
  const std::vector<std::string> texts = CorpusTexts();
  for (const auto& d : dirs) Bench(d, texts, seconds);
  return 0;
}
