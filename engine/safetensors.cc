#include "engine/safetensors.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <fstream>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "nlohmann/json.hpp"

namespace ballast::engine {

using nlohmann::json;

namespace {

// A file mapped read-only, whole.
struct FileMap {
  void* map = nullptr;
  size_t size = 0;
};

// Maps `path` (at least 8 bytes: the header length) read-only.
absl::StatusOr<FileMap> MapFile(const std::string& path) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    return absl::NotFoundError(absl::StrCat("cannot open ", path, ": ", std::strerror(errno)));
  }
  struct stat st;
  if (fstat(fd, &st) != 0) {
    ::close(fd);
    return absl::InternalError(absl::StrCat("cannot stat ", path));
  }
  const size_t size = static_cast<size_t>(st.st_size);
  if (size < 8) {
    ::close(fd);
    return absl::DataLossError(
        absl::StrCat(path, ": file is ", size, " bytes, too short for a safetensors header"));
  }
  void* map = mmap(nullptr, size, PROT_READ, MAP_PRIVATE, fd, 0);
  ::close(fd);
  if (map == MAP_FAILED) return absl::InternalError(absl::StrCat("cannot mmap ", path));
  return FileMap{map, size};
}

// Whether `a` is an array of integers.
bool AllIntegers(const json& a) {
  if (!a.is_array()) return false;
  for (const json& x : a) {
    if (!x.is_number_integer()) return false;
  }
  return true;
}

// One header entry `e` (tensor `name` of file `path`) as a view into
// `data` (the `data_size` bytes after the header), checked.
absl::StatusOr<TensorView> ParseTensorEntry(const std::string& path, const std::string& name,
                                            const json& e, const uint8_t* data, size_t data_size) {
  auto bad = [&](const std::string& what) {
    return absl::DataLossError(absl::StrCat(path, ": tensor \"", name, "\": ", what));
  };
  if (!e.is_object() || !e.contains("dtype") || !e.contains("shape") ||
      !e.contains("data_offsets")) {
    return bad("entry lacks dtype, shape or data_offsets");
  }
  TensorView v;
  v.name = name;
  try {
    auto dt = DTypeFromSafetensors(e["dtype"].get<std::string>());
    if (!dt.ok()) return bad(std::string(dt.status().message()));
    v.dtype = *dt;
    // Integers only: a number past 2^64 parses as a float, and converting
    // that to an integer is undefined (the fuzzer found it).
    if (!AllIntegers(e["shape"])) return bad("shape is not an array of integers");
    if (!AllIntegers(e["data_offsets"])) return bad("data_offsets is not an array of integers");
    v.shape = e["shape"].get<std::vector<int64_t>>();
    auto off = e["data_offsets"].get<std::vector<uint64_t>>();
    if (off.size() != 2 || off[0] > off[1]) return bad("malformed data_offsets");
    if (off[1] > data_size) {
      return bad(absl::StrCat("data_offsets [", off[0], ", ", off[1], ") run past the end of ",
                              "the data (", data_size, " bytes): file truncated?"));
    }
    // numel() (an int64 product) cannot overflow.
    int64_t elements = 1;
    for (int64_t d : v.shape) {
      if (d < 0) return bad("negative dimension");
      if (__builtin_mul_overflow(elements, d, &elements)) {
        return bad(
            absl::StrCat("shape [", absl::StrJoin(v.shape, ", "), "] has more than 2^63 elements"));
      }
    }
    v.data = data + off[0];
    v.nbytes = off[1] - off[0];
  } catch (const json::exception& ex) {
    return bad(absl::StrCat("malformed entry: ", ex.what()));
  }
  if (static_cast<size_t>(v.numel()) * DTypeSize(v.dtype) != v.nbytes) {
    return bad(absl::StrCat("shape [", absl::StrJoin(v.shape, ", "), "] of ",
                            SafetensorsName(v.dtype), " needs ", v.numel() * DTypeSize(v.dtype),
                            " bytes but data_offsets span ", v.nbytes));
  }
  return v;
}

}  // namespace

SafetensorsFile::~SafetensorsFile() {
  if (map_ != nullptr) munmap(map_, map_size_);
}

const TensorView* SafetensorsFile::Find(const std::string& name) const {
  auto it = tensors_.find(name);
  return it == tensors_.end() ? nullptr : &it->second;
}

absl::StatusOr<std::unique_ptr<SafetensorsFile>> SafetensorsFile::Open(const std::string& path) {
  auto mapped = MapFile(path);
  if (!mapped.ok()) return mapped.status();
  void* map = mapped->map;
  const size_t size = mapped->size;
  std::unique_ptr<SafetensorsFile> f(new SafetensorsFile());
  f->path_ = path;
  f->map_ = map;
  f->map_size_ = size;

  const auto* base = static_cast<const uint8_t*>(map);
  uint64_t header_len = 0;
  std::memcpy(&header_len, base, 8);  // little-endian on x86-64
  if (header_len > size - 8) {
    return absl::DataLossError(absl::StrCat(path, ": header length ", header_len,
                                            " exceeds the file (", size, " bytes): truncated?"));
  }
  json header;
  try {
    header = json::parse(base + 8, base + 8 + header_len);
  } catch (const json::exception& e) {
    return absl::DataLossError(absl::StrCat(path, ": header is not valid JSON: ", e.what()));
  }
  if (!header.is_object()) return absl::DataLossError(absl::StrCat(path, ": header not an object"));
  const uint8_t* data = base + 8 + header_len;
  const size_t data_size = size - 8 - header_len;
  for (auto it = header.begin(); it != header.end(); ++it) {
    if (it.key() == "__metadata__") continue;
    const std::string& name = it.key();
    auto v = ParseTensorEntry(path, name, it.value(), data, data_size);
    if (!v.ok()) return v.status();
    f->tensors_.emplace(name, *std::move(v));
  }
  return f;
}

absl::Status WriteSafetensors(const std::string& path, const std::vector<OwnedTensor>& tensors,
                              const std::map<std::string, std::string>& metadata) {
  json header = json::object();
  if (!metadata.empty()) header["__metadata__"] = metadata;
  uint64_t offset = 0;
  for (const auto& t : tensors) {
    header[t.name] = {{"dtype", SafetensorsName(t.dtype)},
                      {"shape", t.shape},
                      {"data_offsets", {offset, offset + t.bytes.size()}}};
    offset += t.bytes.size();
  }
  std::string h = header.dump();
  while ((h.size() + 8) % 8 != 0) h.push_back(' ');
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  if (!out) return absl::PermissionDeniedError(absl::StrCat("cannot write ", path));
  const uint64_t len = h.size();
  out.write(reinterpret_cast<const char*>(&len), 8);
  out.write(h.data(), static_cast<std::streamsize>(h.size()));
  for (const auto& t : tensors)
    out.write(reinterpret_cast<const char*>(t.bytes.data()),
              static_cast<std::streamsize>(t.bytes.size()));
  out.close();
  if (!out) return absl::DataLossError(absl::StrCat("short write to ", path));
  return absl::OkStatus();
}

}  // namespace ballast::engine
