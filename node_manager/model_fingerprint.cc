#include "node_manager/model_fingerprint.h"

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <memory>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "xxhash.h"

namespace ballast::node_manager {
namespace {

namespace fs = std::filesystem;

absl::StatusOr<std::vector<fs::path>> FilesOf(const std::string& dir) {
  std::vector<fs::path> files;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(dir, ec)) {
    const std::string name = e.path().filename().string();
    if (e.is_regular_file() && (name == "config.json" || absl::EndsWith(name, ".safetensors"))) {
      files.push_back(e.path());
    }
  }
  if (ec) return absl::NotFoundError(absl::StrCat("model directory ", dir, ": ", ec.message()));
  std::sort(files.begin(), files.end());
  return files;
}

}  // namespace

absl::StatusOr<std::string> ModelFileSignature(const std::string& dir) {
  auto files = FilesOf(dir);
  if (!files.ok()) return files.status();
  std::string sig;
  for (const fs::path& f : *files) {
    std::error_code ec;
    const auto size = fs::file_size(f, ec);
    const auto mtime = fs::last_write_time(f, ec).time_since_epoch().count();
    if (ec) return absl::NotFoundError(absl::StrCat(f.string(), ": ", ec.message()));
    absl::StrAppend(&sig, f.filename().string(), ":", size, ":", mtime, ";");
  }
  return sig;
}

absl::StatusOr<uint64_t> ModelFingerprint(const std::string& dir) {
  auto files = FilesOf(dir);
  if (!files.ok()) return files.status();
  XXH3_state_t* state = XXH3_createState();
  XXH3_64bits_reset(state);
  constexpr size_t kBuffer = 8 << 20;
  std::unique_ptr<char[]> buf(new char[kBuffer]);
  absl::Status st;
  for (const fs::path& f : *files) {
    const std::string name = f.filename().string();
    XXH3_64bits_update(state, name.data(), name.size() + 1);  // with its NUL: a separator
    std::ifstream in(f, std::ios::binary);
    if (!in) {
      st = absl::NotFoundError(absl::StrCat("cannot read ", f.string()));
      break;
    }
    while (in) {
      in.read(buf.get(), kBuffer);
      XXH3_64bits_update(state, buf.get(), static_cast<size_t>(in.gcount()));
    }
  }
  const uint64_t h = XXH3_64bits_digest(state);
  XXH3_freeState(state);
  if (!st.ok()) return st;
  return h == 0 ? 1 : h;  // 0 means "no fingerprint" to the engine
}

}  // namespace ballast::node_manager
