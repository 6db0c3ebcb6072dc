#include "node_manager/peer_kv_client.h"

#include <algorithm>
#include <cstring>
#include <string_view>

#include "absl/strings/str_cat.h"
#include "grpcpp/grpcpp.h"
#include "transfer/checksum.h"
#include "transfer/chunker.h"

namespace ballast::node_manager {

bool WriteChunkPieces(const transfer::KvChunk& chunk, uint32_t index,
                      const std::function<bool(const v1::KvChunk&)>& write) {
  // The serialized chunk is header + payload; each piece copies its slice
  // of the two straight into the message (one copy of the payload).
  const std::string header = transfer::EncodeHeader(chunk.meta);
  const std::string_view parts[] = {
      header, std::string_view(reinterpret_cast<const char*>(chunk.payload.get()),
                               chunk.meta.payload_bytes())};
  const uint64_t total = header.size() + chunk.meta.payload_bytes();
  v1::KvChunk m;
  m.set_index(index);
  m.set_total_bytes(total);
  for (uint64_t offset = 0; offset < total;) {
    const uint64_t len = std::min<uint64_t>(kPeerPieceBytes, total - offset);
    std::string* data = m.mutable_data();
    data->clear();
    data->reserve(len);
    uint64_t base = 0;
    for (std::string_view part : parts) {
      const uint64_t lo = std::max(offset, base), hi = std::min(offset + len, base + part.size());
      if (lo < hi) data->append(part.data() + (lo - base), hi - lo);
      base += part.size();
    }
    m.set_offset(offset);
    m.set_crc32c(transfer::Crc32c(*data));
    if (!write(m)) return false;
    offset += len;
  }
  return true;
}

v1::Node::Stub* PeerKvClient::StubFor(const std::string& peer) {
  absl::MutexLock lock(&mu_);
  auto& stub = stubs_[peer];
  if (!stub) {
    stub = v1::Node::NewStub(grpc::CreateChannel(peer, credentials_));
  }
  return stub.get();
}

namespace {

// One chunk arriving in pieces (in order, each with its CRC-32C): the
// header is parsed from the first bytes, then the payload is written
// straight into a chunk from `alloc` (pinned, pooled), and verified whole.
class ChunkAssembly {
 public:
  ChunkAssembly(uint64_t total, const KvPeerFetcher::ChunkAlloc& alloc)
      : total_(total), alloc_(alloc) {}

  absl::Status Add(uint64_t offset, const std::string& data, uint32_t crc32c) {
    if (offset != received_ || received_ + data.size() > total_) {
      return absl::DataLossError(absl::StrCat("piece at offset ", offset, " out of order (",
                                              received_, " of ", total_, " bytes received)"));
    }
    if (transfer::Crc32c(data.data(), data.size()) != crc32c) {
      return absl::DataLossError(absl::StrCat("checksum mismatch in piece at offset ", offset));
    }
    std::string_view rest(data);
    if (!chunk_) {  // still in the header
      const size_t want = std::min<size_t>(rest.size(), transfer::kMaxEncodedHeaderBytes);
      head_.append(rest.substr(0, want));
      size_t header_bytes = 0;
      auto meta = transfer::DecodeHeader(head_, &header_bytes);
      if (meta.ok()) {
        if (header_bytes + meta->payload_bytes() != total_) {
          return absl::DataLossError("chunk length does not match its header");
        }
        chunk_ = alloc_(*meta);
        const size_t in_head = head_.size() - header_bytes;  // payload bytes already in head_
        std::memcpy(chunk_->payload.get(), head_.data() + header_bytes, in_head);
        rest.remove_prefix(want);
        payload_at_ = in_head;
      } else if (!absl::IsOutOfRange(meta.status()) ||
                 head_.size() >= transfer::kMaxEncodedHeaderBytes) {
        return meta.status();
      } else {
        rest.remove_prefix(want);
      }
    }
    if (chunk_ && !rest.empty()) {
      std::memcpy(chunk_->payload.get() + payload_at_, rest.data(), rest.size());
      payload_at_ += rest.size();
    }
    received_ += data.size();
    return absl::OkStatus();
  }

  absl::StatusOr<std::unique_ptr<transfer::KvChunk>> Finish() {
    if (!chunk_ || received_ != total_) {
      return absl::DataLossError(
          absl::StrCat("chunk incomplete: ", received_, " of ", total_, " bytes received"));
    }
    if (auto st = chunk_->VerifyPayload(); !st.ok()) return st;
    return std::move(chunk_);
  }

 private:
  const uint64_t total_;
  const KvPeerFetcher::ChunkAlloc& alloc_;
  uint64_t received_ = 0;
  std::string head_;
  size_t payload_at_ = 0;
  std::unique_ptr<transfer::KvChunk> chunk_;
};

}  // namespace

absl::StatusOr<std::vector<std::unique_ptr<transfer::KvChunk>>> PeerKvClient::Fetch(
    const std::string& peer, const std::string& tenant, uint64_t kv_fingerprint,
    absl::Span<const int> tokens, int first_token, int max_tokens, const ChunkAlloc& alloc) {
  v1::FetchKvRequest req;
  req.set_tenant(tenant);
  req.set_kv_fingerprint(kv_fingerprint);
  req.mutable_tokens()->Add(tokens.begin(), tokens.end());
  req.set_first_token(static_cast<uint32_t>(first_token));
  req.set_max_tokens(static_cast<uint32_t>(max_tokens));
  grpc::ClientContext ctx;
  ctx.set_deadline(absl::ToChronoTime(absl::Now() + timeout_));
  auto reader = StubFor(peer)->FetchKv(&ctx, req);
  std::vector<std::unique_ptr<transfer::KvChunk>> out;
  std::unique_ptr<ChunkAssembly> pending;
  uint32_t index = 0;
  absl::Status failed;
  // Completes the chunk being received (verifying it) into `out`.
  auto finish = [&]() -> absl::Status {
    auto chunk = pending->Finish();
    pending.reset();
    if (!chunk.ok()) return chunk.status();
    out.push_back(std::move(*chunk));
    return absl::OkStatus();
  };
  v1::KvChunk piece;
  while (failed.ok() && reader->Read(&piece)) {
    if (pending && piece.index() != index) failed = finish();
    if (!failed.ok()) break;
    if (!pending) {
      if (piece.index() != out.size()) {
        failed = absl::DataLossError(
            absl::StrCat("peer ", peer, ": chunk ", piece.index(), " out of order"));
        break;
      }
      index = piece.index();
      pending = std::make_unique<ChunkAssembly>(piece.total_bytes(), alloc);
    }
    failed = pending->Add(piece.offset(), piece.data(), piece.crc32c());
  }
  if (failed.ok() && pending) failed = finish();
  if (!failed.ok()) ctx.TryCancel();
  const grpc::Status st = reader->Finish();
  // Chunks received whole before a failure are still good (each verified).
  if (!st.ok() && out.empty()) {
    return absl::UnavailableError(absl::StrCat("peer ", peer, ": ", st.error_message()));
  }
  return out;
}

}  // namespace ballast::node_manager
