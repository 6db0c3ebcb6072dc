#include "transfer/kv_chunk.h"

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <new>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "xxhash.h"

namespace ballast::transfer {
namespace {

constexpr char kMagic[4] = {'B', 'L', 'K', 'V'};
constexpr uint32_t kVersion = 1;
constexpr size_t kMaxTenantBytes = 256;
// magic, version, key, parent, fingerprint, first/num tokens, layers,
// blocks per layer, block bytes, payload checksum, tenant length; then the
// tenant; then the header checksum.
constexpr size_t kFixedBytes = 4 + 4 + 16 + 16 + 8 + 4 + 4 + 4 + 4 + 8 + 8 + 4;

KvChunkKey FromXxh128(XXH128_hash_t h) { return {h.high64, h.low64}; }

class Writer {
 public:
  explicit Writer(std::string* out) : out_(out) {}
  void Bytes(const void* p, size_t n) { out_->append(static_cast<const char*>(p), n); }
  template <typename T>
  void Put(T v) {  // little-endian hosts only (x86-64, aarch64)
    Bytes(&v, sizeof(v));
  }

 private:
  std::string* out_;
};

class Reader {
 public:
  explicit Reader(std::string_view in) : in_(in) {}
  template <typename T>
  T Get() {
    T v{};
    std::memcpy(&v, in_.data() + pos_, sizeof(v));
    pos_ += sizeof(v);
    return v;
  }
  std::string_view Take(size_t n) {
    std::string_view s = in_.substr(pos_, n);
    pos_ += n;
    return s;
  }
  size_t pos() const { return pos_; }

 private:
  std::string_view in_;
  size_t pos_ = 0;
};

}  // namespace

std::string KvChunkKey::Hex() const { return absl::StrFormat("%016x%016x", hi, lo); }

KvChunkKey RootKey(std::string_view tenant, uint64_t model_fingerprint) {
  std::string seed = "ballast-kv/1";
  const auto len = static_cast<uint32_t>(tenant.size());
  seed.append(reinterpret_cast<const char*>(&len), sizeof(len));
  seed.append(tenant);
  seed.append(reinterpret_cast<const char*>(&model_fingerprint), sizeof(model_fingerprint));
  return FromXxh128(XXH3_128bits(seed.data(), seed.size()));
}

KvChunkKey NextKey(const KvChunkKey& parent, absl::Span<const int> tokens) {
  XXH3_state_t* state = XXH3_createState();
  XXH3_128bits_reset(state);
  XXH3_128bits_update(state, &parent.hi, sizeof(parent.hi));
  XXH3_128bits_update(state, &parent.lo, sizeof(parent.lo));
  XXH3_128bits_update(state, tokens.data(), tokens.size() * sizeof(int));
  const KvChunkKey key = FromXxh128(XXH3_128bits_digest(state));
  XXH3_freeState(state);
  return key;
}

void PayloadFree::operator()(uint8_t* p) const {
  if (recycle) {
    recycle(p);
  } else {
    std::free(p);
  }
}

std::unique_ptr<KvChunk> KvChunk::Allocate(const KvChunkMeta& meta) {
  constexpr size_t kPage = 4096;
  auto c = std::make_unique<KvChunk>();
  c->meta = meta;
  const size_t n = (std::max<size_t>(meta.payload_bytes(), 1) + kPage - 1) / kPage * kPage;
  c->payload.reset(static_cast<uint8_t*>(std::aligned_alloc(kPage, n)));
  if (!c->payload) throw std::bad_alloc();
  return c;
}

uint64_t LayerChecksum(const KvChunk& chunk, uint32_t layer) {
  return XXH3_64bits(chunk.layer_data(layer),
                     static_cast<size_t>(chunk.meta.blocks_per_layer) * chunk.meta.block_bytes);
}

uint64_t CombineChecksums(absl::Span<const uint64_t> layer_checksums) {
  return XXH3_64bits(layer_checksums.data(), layer_checksums.size() * sizeof(uint64_t));
}

namespace {
uint64_t PayloadChecksum(const KvChunk& c) {
  std::vector<uint64_t> layers(c.meta.num_layers);
  for (uint32_t l = 0; l < c.meta.num_layers; ++l) layers[l] = LayerChecksum(c, l);
  return CombineChecksums(layers);
}
}  // namespace

void KvChunk::Seal() { meta.payload_checksum = PayloadChecksum(*this); }

absl::Status KvChunk::VerifyPayload() const {
  if (PayloadChecksum(*this) != meta.payload_checksum) {
    return absl::DataLossError(
        absl::StrCat("KV chunk ", meta.key.Hex(), ": payload checksum mismatch"));
  }
  return absl::OkStatus();
}

size_t EncodedHeaderBytes(size_t tenant_bytes) { return kFixedBytes + tenant_bytes + 8; }

std::string EncodeHeader(const KvChunkMeta& m) {
  std::string out;
  out.reserve(EncodedHeaderBytes(m.tenant.size()));
  Writer w(&out);
  w.Bytes(kMagic, sizeof(kMagic));
  w.Put(kVersion);
  w.Put(m.key.hi);
  w.Put(m.key.lo);
  w.Put(m.parent.hi);
  w.Put(m.parent.lo);
  w.Put(m.model_fingerprint);
  w.Put(m.first_token);
  w.Put(m.num_tokens);
  w.Put(m.num_layers);
  w.Put(m.blocks_per_layer);
  w.Put(m.block_bytes);
  w.Put(m.payload_checksum);
  w.Put(static_cast<uint32_t>(m.tenant.size()));
  w.Bytes(m.tenant.data(), m.tenant.size());
  w.Put(static_cast<uint64_t>(XXH3_64bits(out.data(), out.size())));
  return out;
}

absl::StatusOr<KvChunkMeta> DecodeHeader(std::string_view bytes, size_t* header_bytes) {
  if (bytes.size() < kFixedBytes) {
    return absl::OutOfRangeError(
        absl::StrCat("KV chunk header: ", bytes.size(), " of at least ", kFixedBytes, " bytes"));
  }
  if (std::memcmp(bytes.data(), kMagic, sizeof(kMagic)) != 0) {
    return absl::DataLossError("KV chunk header: bad magic (not a Ballast KV chunk)");
  }
  Reader r(bytes.substr(sizeof(kMagic)));
  if (const auto v = r.Get<uint32_t>(); v != kVersion) {
    return absl::DataLossError(
        absl::StrCat("KV chunk header: version ", v, " (expected ", kVersion, ")"));
  }
  KvChunkMeta m;
  m.key.hi = r.Get<uint64_t>();
  m.key.lo = r.Get<uint64_t>();
  m.parent.hi = r.Get<uint64_t>();
  m.parent.lo = r.Get<uint64_t>();
  m.model_fingerprint = r.Get<uint64_t>();
  m.first_token = r.Get<uint32_t>();
  m.num_tokens = r.Get<uint32_t>();
  m.num_layers = r.Get<uint32_t>();
  m.blocks_per_layer = r.Get<uint32_t>();
  m.block_bytes = r.Get<uint64_t>();
  m.payload_checksum = r.Get<uint64_t>();
  const auto tenant_len = r.Get<uint32_t>();
  if (tenant_len > kMaxTenantBytes) {
    return absl::DataLossError(absl::StrCat("KV chunk header: tenant of ", tenant_len, " bytes"));
  }
  const size_t total = EncodedHeaderBytes(tenant_len);
  if (bytes.size() < total) {
    return absl::OutOfRangeError(
        absl::StrCat("KV chunk header: ", bytes.size(), " of ", total, " bytes"));
  }
  m.tenant = std::string(r.Take(tenant_len));
  const auto stored = r.Get<uint64_t>();
  if (stored != XXH3_64bits(bytes.data(), total - 8)) {
    return absl::DataLossError("KV chunk header: checksum mismatch");
  }
  *header_bytes = total;
  return m;
}

absl::StatusOr<std::unique_ptr<KvChunk>> DecodeChunk(std::string_view bytes) {
  size_t header = 0;
  auto meta = DecodeHeader(bytes, &header);
  if (!meta.ok()) {
    if (meta.status().code() == absl::StatusCode::kOutOfRange) {
      return absl::DataLossError(absl::StrCat("truncated: ", meta.status().message()));
    }
    return meta.status();
  }
  const uint64_t want = meta->payload_bytes();
  if (bytes.size() - header != want) {
    return absl::DataLossError(absl::StrCat("KV chunk ", meta->key.Hex(), ": payload is ",
                                            bytes.size() - header, " bytes, header says ", want,
                                            " (truncated)"));
  }
  auto chunk = KvChunk::Allocate(*meta);
  std::memcpy(chunk->payload.get(), bytes.data() + header, want);
  if (auto st = chunk->VerifyPayload(); !st.ok()) return st;
  return chunk;
}

}  // namespace ballast::transfer
