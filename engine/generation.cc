#include "engine/generation.h"

#include <algorithm>

namespace ballast::engine {

OutputText::OutputText(const Tokenizer* tokenizer, std::vector<std::string> stop,
                       bool skip_special_tokens)
    : decoder_(tokenizer, skip_special_tokens), stop_(std::move(stop)) {
  stop_.erase(std::remove(stop_.begin(), stop_.end(), std::string()), stop_.end());
  for (const auto& s : stop_) max_stop_ = std::max(max_stop_, s.size());
}

std::string OutputText::Release(size_t upto) {
  std::string out = text_.substr(released_.size(), upto - released_.size());
  released_ += out;
  return out;
}

std::string OutputText::Add(int id, bool* stopped) {
  *stopped = false;
  const size_t before = text_.size();
  text_ += decoder_.Push(id);
  if (stop_.empty()) return Release(text_.size());
  // Earliest match that can involve the new text.
  const size_t from = before >= max_stop_ ? before - max_stop_ + 1 : 0;
  size_t best = std::string::npos;
  for (const auto& s : stop_) best = std::min(best, text_.find(s, from));
  if (best != std::string::npos) {
    text_.resize(best);
    *stopped = true;
    return Release(text_.size());
  }
  // Hold back the longest suffix that is a proper prefix of a stop string.
  size_t hold = 0;
  for (const auto& s : stop_) {
    for (size_t len = std::min(s.size() - 1, text_.size()); len > hold; --len) {
      if (text_.compare(text_.size() - len, len, s, 0, len) == 0) {
        hold = len;
        break;
      }
    }
  }
  return Release(text_.size() - hold);
}

std::string OutputText::Finish() {
  text_ += decoder_.Flush();
  return Release(text_.size());
}

}  // namespace ballast::engine
