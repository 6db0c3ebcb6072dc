#include "node_manager/peer_kv_client.h"

#include <algorithm>
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
    stub = v1::Node::NewStub(grpc::CreateChannel(peer, grpc::InsecureChannelCredentials()));
  }
  return stub.get();
}

absl::StatusOr<std::vector<std::unique_ptr<transfer::KvChunk>>> PeerKvClient::Fetch(
    const std::string& peer, const std::string& tenant, uint64_t kv_fingerprint,
    absl::Span<const int> tokens, int first_token, int max_tokens) {
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
  std::unique_ptr<transfer::Reassembler> pending;
  uint32_t index = 0;
  absl::Status failed;
  // Completes the chunk being reassembled (verifying it) into `out`.
  auto finish = [&]() -> absl::Status {
    std::string bytes;
    if (auto st = pending->Take(&bytes); !st.ok()) return st;
    auto chunk = transfer::DecodeChunk(bytes);
    if (!chunk.ok()) return chunk.status();
    out.push_back(std::move(*chunk));
    pending.reset();
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
      pending = std::make_unique<transfer::Reassembler>(piece.total_bytes());
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
