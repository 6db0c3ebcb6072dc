#include "server/gateway/http_gateway.h"

#include <grpcpp/grpcpp.h>
#include <pthread.h>

#include <boost/asio.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <boost/beast/ssl.hpp>
#include <optional>
#include <thread>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "ballast/v1/inference.grpc.pb.h"
#include "proto/token_events.h"
#include "server/gateway/call_registry.h"
#include "server/gateway/gateway_tls.h"
#include "server/gateway/http_framing.h"
#include "server/gateway/openai_protocol.h"
#include "server/gateway/upstream_call.h"
#include "server/request_id.h"
#include "spdlog/spdlog.h"

namespace ballast::server::gateway {
namespace {

namespace net = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;
using tcp = net::ip::tcp;
using Executor = net::any_io_executor;

constexpr size_t kHeaderLimit = 16 << 10;
constexpr auto kRequestTimeout = std::chrono::seconds(30);

}  // namespace

struct HttpGateway::Impl {
  GatewayOptions options;
  std::string address;
  net::io_context ioc;
  // The acceptor, its back-off timer and Shutdown's close run on one strand:
  // with several io threads they would otherwise race (found by TSan).
  net::strand<net::io_context::executor_type> accept_strand = net::make_strand(ioc);
  tcp::acceptor acceptor{accept_strand};
  net::steady_timer accept_backoff{accept_strand};
  std::vector<std::thread> threads;
  std::shared_ptr<grpc::Channel> channel;
  std::unique_ptr<v1::Inference::Stub> stub;
  CallRegistry calls;
  std::unique_ptr<GatewayTls> tls;  // null: plain HTTP
  bool stopped = false;

  void Accept();
};

namespace {

using TlsStream = beast::ssl_stream<beast::tcp_stream>;

// One HTTP connection, over `Stream`: beast::tcp_stream (plain HTTP) or
// TlsStream (HTTPS). All its members are used on its strand only.
template <class Stream>
class Session final : public SessionBase {
 public:
  static constexpr bool kTls = std::is_same_v<Stream, TlsStream>;
  // `tls`: the context of a TLS connection (null for plain HTTP).
  Session(tcp::socket socket, std::shared_ptr<net::ssl::context> tls, HttpGateway::Impl* gw)
      : executor_(socket.get_executor()),
        tls_(std::move(tls)),
        stream_(Open(std::move(socket), tls_.get())),
        gw_(gw) {}

  void Start() {
    net::dispatch(executor_, [self = Self()] { self->Handshake(); });
  }
  void PostEvent(v1::GenerateResponse r) override {
    net::post(executor_, [self = Self(), r = std::move(r)] { self->OnEvent(r); });
  }
  void PostDone(grpc::Status st, int64_t retry_after_ms) override {
    net::post(executor_, [self = Self(), st, retry_after_ms] {
      self->retry_after_ms_ = retry_after_ms;
      self->OnUpstreamDone(st);
    });
  }

 private:
  static Stream Open(tcp::socket socket, net::ssl::context* tls) {
    if constexpr (kTls) {
      return Stream(std::move(socket), *tls);
    } else {
      return Stream(std::move(socket));
    }
  }
  std::shared_ptr<Session> Self() { return std::static_pointer_cast<Session>(shared_from_this()); }
  auto& Lowest() { return beast::get_lowest_layer(stream_); }
  // TLS: the handshake (within the request timeout) before the first read.
  void Handshake() {
    if constexpr (kTls) {
      Lowest().expires_after(kRequestTimeout);
      stream_.async_handshake(net::ssl::stream_base::server, [self = Self()](beast::error_code ec) {
        if (ec) return self->Close();
        self->ReadRequest();
      });
    } else {
      ReadRequest();
    }
  }

  enum class After { kNothing, kReadNext, kClose };
  // What follows a complete response: the client's keep-alive decides.
  After Next() const { return keep_alive_ ? After::kReadNext : After::kClose; }

  void ReadRequest();
  void OnRequest(beast::error_code ec);
  void Route(const http::request<http::string_body>& req);
  void HandleModels();
  void HandleCompletion(const std::string& body, Endpoint endpoint);
  void StartStream();
  void OnEvent(const v1::GenerateResponse& r);
  void OnUpstreamDone(const grpc::Status& st);
  void WatchDisconnect();
  void ClientGone();

  void SendError(const ApiError& e, After after) {
    Write(HttpResponse(e.http_status, ErrorJson(e), after == After::kReadNext, request_id_,
                       e.retry_after_ms),
          after);
  }
  void Write(std::string data, After after) {
    pending_ += data;
    after_ = after;
    if (!writing_) DoWrite();
  }
  void DoWrite();
  // Closes the connection at once (the client left, or sent nothing).
  void Close() {
    beast::error_code ec;
    Lowest().socket().shutdown(tcp::socket::shutdown_send, ec);
    Lowest().socket().close(ec);
  }
  // Closes after a complete response: TLS says close_notify first.
  // A timer of its own bounds it (a read already pending, e.g. the
  // disconnect watch, is not covered by the stream's expiry).
  void Finish() {
    if constexpr (kTls) {
      finish_timer_.emplace(executor_);
      finish_timer_->expires_after(std::chrono::seconds(5));
      finish_timer_->async_wait([self = Self()](beast::error_code ec) {
        if (!ec) self->Close();
      });
      stream_.async_shutdown([self = Self()](beast::error_code) {
        self->finish_timer_->cancel();
        self->Close();
      });
    } else {
      Close();
    }
  }

  Executor executor_;
  std::shared_ptr<net::ssl::context> tls_;  // TLS: outlives stream_
  Stream stream_;
  std::optional<net::steady_timer> finish_timer_;  // TLS: bounds Finish's shutdown
  HttpGateway::Impl* gw_;
  beast::flat_buffer buffer_;
  std::optional<http::request_parser<http::string_body>> parser_;
  // The request being answered: the client's X-Request-Id if valid, else
  // the completion's id (or a new one); sent upstream as x-request-id.
  std::string request_id_;
  bool client_request_id_ = false;
  // The client's Authorization header, passed on as gRPC metadata (the
  // scheduler checks API keys: server/auth.h); empty: none.
  std::string authorization_;
  int64_t retry_after_ms_ = -1;  // the finished upstream call's retry hint
  std::string pending_, inflight_;
  bool writing_ = false;
  bool keep_alive_ = false;  // of the request being answered
  After after_ = After::kNothing;
  // The completion being served (one per connection: it closes after).
  std::shared_ptr<GenerateCall> call_;
  CompletionRequest request_;
  ResponseContext ctx_;
  // Tokens with log-probabilities not yet sent (streams: since the last
  // chunk; otherwise all of them).
  std::vector<v1::Token> tokens_;
  bool headers_sent_ = false, client_gone_ = false, done_ = false;
  std::optional<v1::Final> final_;
  char watch_buf_[512];
};

template <class Stream>
void Session<Stream>::ReadRequest() {
  parser_.emplace();
  parser_->header_limit(kHeaderLimit);
  parser_->body_limit(gw_->options.max_body_bytes);
  Lowest().expires_after(kRequestTimeout);
  http::async_read(stream_, buffer_, *parser_,
                   [self = Self()](beast::error_code ec, size_t) { self->OnRequest(ec); });
}

template <class Stream>
void Session<Stream>::OnRequest(beast::error_code ec) {
  request_id_ = NewRequestId("req-");  // Route takes the client's, if any
  client_request_id_ = false;
  if (ec == http::error::body_limit) {
    ApiError e;
    e.http_status = 413;
    e.message = absl::StrCat("request body exceeds ", gw_->options.max_body_bytes, " bytes");
    return SendError(e, After::kClose);
  }
  if (ec == http::error::header_limit) {
    ApiError e;
    e.http_status = 431;
    e.message = absl::StrCat("request headers exceed ", kHeaderLimit, " bytes");
    return SendError(e, After::kClose);
  }
  if (ec == http::error::end_of_stream || ec == beast::error::timeout ||
      ec == net::error::operation_aborted || ec == net::error::eof ||
      ec == net::ssl::error::stream_truncated) {  // TLS: left without close_notify
    return Close();
  }
  if (ec) {
    ApiError e;
    e.http_status = 400;
    e.message = absl::StrCat("malformed HTTP request: ", ec.message());
    return SendError(e, After::kClose);
  }
  Lowest().expires_never();
  Route(parser_->get());
}

template <class Stream>
void Session<Stream>::Route(const http::request<http::string_body>& req) {
  const std::string_view full(req.target().data(), req.target().size());
  const std::string path(full.substr(0, full.find('?')));
  keep_alive_ = req.keep_alive();
  const auto header = req.find("X-Request-Id");
  const std::string client_id =
      header == req.end() ? "" : std::string(header->value().data(), header->value().size());
  client_request_id_ = ValidRequestId(client_id);
  request_id_ = client_request_id_ ? client_id : NewRequestId("req-");
  const auto auth = req.find(http::field::authorization);
  authorization_ = auth == req.end() ? "" : std::string(auth->value().data(), auth->value().size());
  const After after = Next();
  ApiError e;
  if (!std::all_of(authorization_.begin(), authorization_.end(),
                   [](char c) { return c >= 0x20 && c < 0x7f; })) {
    e.http_status = 401;
    e.message = "the Authorization header must be printable ASCII (\"Bearer <key>\")";
    return SendError(e, after);
  }
  if (path == "/v1/models" || path == "/v1/completions" || path == "/v1/chat/completions") {
    const http::verb want = path == "/v1/models" ? http::verb::get : http::verb::post;
    if (req.method() != want) {
      e.http_status = 405;
      e.message = absl::StrCat(path, " expects ", std::string(http::to_string(want)));
      return SendError(e, after);
    }
  }
  if (path == "/v1/models") return HandleModels();
  if (path == "/v1/completions") return HandleCompletion(req.body(), Endpoint::kCompletions);
  if (path == "/v1/chat/completions") {
    return HandleCompletion(req.body(), Endpoint::kChatCompletions);
  }
  e.http_status = 404;
  e.message = absl::StrCat("unknown endpoint ", std::string(req.method_string()), " ", path,
                           " (serving /v1/models, /v1/completions, /v1/chat/completions)");
  SendError(e, after);
}

template <class Stream>
void Session<Stream>::HandleModels() {
  auto call = std::make_shared<ModelsCall>();
  call->ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
  if (!authorization_.empty()) call->ctx.AddMetadata("authorization", authorization_);
  if (!gw_->calls.Add(call)) {
    return SendError(FromGrpcStatus({grpc::StatusCode::UNAVAILABLE, "shutting down"}),
                     After::kClose);
  }
  CallRegistry* registry = &gw_->calls;
  gw_->stub->async()->ListModels(&call->ctx, &call->req, &call->resp,
                                 [self = Self(), call, registry](grpc::Status st) {
                                   net::post(self->executor_, [self, call, st] {
                                     if (!st.ok())
                                       return self->SendError(FromGrpcStatus(st), self->Next());
                                     const int64_t created = absl::ToUnixSeconds(absl::Now());
                                     self->Write(HttpResponse(200, ModelsJson(call->resp, created),
                                                              self->keep_alive_, self->request_id_),
                                                 self->Next());
                                   });
                                   registry->Remove(call.get());
                                 });
}

template <class Stream>
void Session<Stream>::HandleCompletion(const std::string& body, Endpoint endpoint) {
  ApiError e;
  request_ = CompletionRequest();  // an earlier refused request may have filled parts
  const bool chat = endpoint == Endpoint::kChatCompletions;
  const bool parsed = chat ? ParseChatCompletionRequest(body, &request_, &e)
                           : ParseCompletionRequest(body, &request_, &e);
  if (!parsed) return SendError(e, Next());
  ctx_.id = NewRequestId(chat ? "chatcmpl-" : "cmpl-");
  if (!client_request_id_) request_id_ = ctx_.id;
  ctx_.model = request_.generate.model();
  ctx_.created = absl::ToUnixSeconds(absl::Now());
  ctx_.endpoint = endpoint;
  ctx_.include_usage = request_.include_usage;
  ctx_.logprobs = request_.logprobs;
  call_ = std::make_shared<GenerateCall>(Self(), &gw_->calls);
  call_->ctx.AddMetadata(kRequestIdKey, request_id_);
  if (!authorization_.empty()) call_->ctx.AddMetadata("authorization", authorization_);
  if (!gw_->calls.Add(call_)) {
    call_.reset();
    return SendError(FromGrpcStatus({grpc::StatusCode::UNAVAILABLE, "shutting down"}),
                     After::kClose);
  }
  call_->Start(gw_->stub.get(), request_.generate, call_);
  WatchDisconnect();
}

// While a completion runs, a read on the socket notices the client leaving
// (EOF or reset) and cancels the upstream call. Bytes a client sends meanwhile
// are dropped: a completion's connection closes after its response.
template <class Stream>
void Session<Stream>::WatchDisconnect() {
  stream_.async_read_some(net::buffer(watch_buf_), [self = Self()](beast::error_code ec, size_t) {
    // An error closes the connection even after the response: a TLS client
    // that leaves without close_notify must not leave it open.
    if (ec) return self->ClientGone();
    if (self->done_) return;
    self->WatchDisconnect();
  });
}

template <class Stream>
void Session<Stream>::ClientGone() {
  if (client_gone_) return;
  client_gone_ = true;
  if (call_ && !done_) call_->ctx.TryCancel();
  Close();
}

template <class Stream>
void Session<Stream>::OnEvent(const v1::GenerateResponse& r) {
  if (client_gone_) return;
  if (r.has_final()) {
    final_ = r.final();
    return;
  }
  // A batch (the stream fell behind) goes out as one chunk.
  std::string text;
  ForEachToken(r, [&](const v1::Token& t) {
    if (request_.logprobs) tokens_.push_back(t);
    text += t.text();
  });
  if (!request_.stream || text.empty()) return;
  StartStream();
  Write(StreamChunkEvent(ctx_, text, tokens_, ""), After::kNothing);
  tokens_.clear();
}

// The SSE headers, and the role chunk that opens a chat stream.
template <class Stream>
void Session<Stream>::StartStream() {
  if (headers_sent_) return;
  headers_sent_ = true;
  pending_ += SseHeaders(request_id_);
  if (ctx_.endpoint == Endpoint::kChatCompletions) pending_ += StreamRoleEvent(ctx_);
}

template <class Stream>
void Session<Stream>::OnUpstreamDone(const grpc::Status& st) {
  done_ = true;
  if (client_gone_) return;
  grpc::Status status = st;
  if (st.ok() && !final_) status = {grpc::StatusCode::INTERNAL, "no final message upstream"};
  if (!status.ok()) {
    if (!headers_sent_) {
      ApiError e = FromGrpcStatus(status);
      e.retry_after_ms = retry_after_ms_;
      return SendError(e, After::kClose);
    }
    return Write(StreamErrorEvent(FromGrpcStatus(status)), After::kClose);
  }
  if (!request_.stream) {
    return Write(HttpResponse(200, CompletionJson(ctx_, *final_, tokens_), false, request_id_),
                 After::kClose);
  }
  StartStream();
  // The last chunk carries the finish reason and the log-probabilities of
  // tokens that released no text (e.g. the end-of-sequence token).
  std::string out = StreamChunkEvent(ctx_, "", tokens_, FinishReasonName(final_->finish_reason()));
  tokens_.clear();
  if (request_.include_usage) out += StreamUsageEvent(ctx_, final_->usage());
  out += kStreamDone;
  Write(std::move(out), After::kClose);
}

template <class Stream>
void Session<Stream>::DoWrite() {
  if (pending_.empty()) {
    if (after_ == After::kClose) {
      Finish();
    } else if (after_ == After::kReadNext) {
      after_ = After::kNothing;
      ReadRequest();
    }
    return;
  }
  writing_ = true;
  inflight_.swap(pending_);
  pending_.clear();
  net::async_write(stream_, net::buffer(inflight_), [self = Self()](beast::error_code ec, size_t) {
    self->writing_ = false;
    self->inflight_.clear();
    if (ec) return self->ClientGone();
    self->DoWrite();
  });
}

}  // namespace

void HttpGateway::Impl::Accept() {
  acceptor.async_accept(net::make_strand(ioc), [this](beast::error_code ec, tcp::socket socket) {
    if (!acceptor.is_open() || ec == net::error::operation_aborted) return;
    if (!ec) {
      if (tls) {
        std::make_shared<Session<TlsStream>>(std::move(socket), tls->Current(), this)->Start();
      } else {
        std::make_shared<Session<beast::tcp_stream>>(std::move(socket), nullptr, this)->Start();
      }
      return Accept();
    }
    // Out of descriptors or similar: back off instead of spinning.
    spdlog::warn("gateway: accept failed: {}", ec.message());
    accept_backoff.expires_after(std::chrono::milliseconds(100));
    accept_backoff.async_wait([this](beast::error_code) { Accept(); });
  });
}

std::string LoopbackTarget(const std::string& bound) {
  const auto colon = bound.rfind(':');
  const std::string host = bound.substr(0, colon);
  if (host.empty() || host == "0.0.0.0" || host == "[::]" || host == "::") {
    return absl::StrCat("127.0.0.1", bound.substr(colon));
  }
  return bound;
}

absl::StatusOr<std::unique_ptr<HttpGateway>> HttpGateway::Create(const GatewayOptions& options) {
  auto impl = std::make_unique<Impl>();
  impl->options = options;
  const auto colon = options.listen.rfind(':');
  if (colon == std::string::npos) {
    return absl::InvalidArgumentError(
        absl::StrCat("gateway: \"", options.listen, "\" is not host:port"));
  }
  std::string host = options.listen.substr(0, colon);
  if (host.size() > 1 && host.front() == '[') host = host.substr(1, host.size() - 2);
  beast::error_code ec;
  tcp::resolver resolver(impl->ioc);
  const auto found =
      resolver.resolve(host.empty() ? "0.0.0.0" : host, options.listen.substr(colon + 1), ec);
  if (!ec && found.empty()) ec = net::error::host_not_found;
  if (!ec) {
    const tcp::endpoint ep = found.begin()->endpoint();
    impl->acceptor.open(ep.protocol(), ec);
    if (!ec) impl->acceptor.set_option(net::socket_base::reuse_address(true), ec);
    if (!ec) impl->acceptor.bind(ep, ec);
    if (!ec) impl->acceptor.listen(net::socket_base::max_listen_connections, ec);
  }
  if (ec) {
    return absl::UnavailableError(
        absl::StrCat("gateway: cannot listen on ", options.listen, ": ", ec.message()));
  }
  impl->address =
      absl::StrCat(options.listen.substr(0, colon), ":", impl->acceptor.local_endpoint().port());
  if (options.tls) {
    auto tls = GatewayTls::Create(*options.tls);
    if (!tls.ok()) return tls.status();
    impl->tls = std::move(*tls);
  }
  impl->channel = grpc::CreateChannel(options.upstream, options.upstream_credentials
                                                            ? options.upstream_credentials
                                                            : grpc::InsecureChannelCredentials());
  impl->stub = v1::Inference::NewStub(impl->channel);
  impl->Accept();
  for (int i = 0; i < std::max(1, options.io_threads); ++i) {
    impl->threads.emplace_back([raw = impl.get()] {
      pthread_setname_np(pthread_self(), "ballast-gw-io");  // told apart in /proc, top -H
      raw->ioc.run();
    });
  }
  spdlog::info("OpenAI-compatible gateway on {}://{} (upstream {}, {} io threads)",
               impl->tls ? "https" : "http", impl->address, options.upstream, impl->threads.size());
  return std::unique_ptr<HttpGateway>(new HttpGateway(std::move(impl)));
}

HttpGateway::HttpGateway(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
HttpGateway::~HttpGateway() { Shutdown(); }
const std::string& HttpGateway::address() const { return impl_->address; }

void HttpGateway::Shutdown() {
  if (impl_->stopped) return;
  impl_->stopped = true;
  net::post(impl_->accept_strand, [raw = impl_.get()] {
    beast::error_code ec;
    raw->acceptor.close(ec);
    raw->accept_backoff.cancel();
  });
  if (!impl_->calls.CancelAllAndWait(absl::Seconds(5))) {
    spdlog::warn("gateway: upstream calls still running after 5 s at shutdown");
  }
  impl_->ioc.stop();
  for (auto& t : impl_->threads) t.join();
  impl_->threads.clear();
}

}  // namespace ballast::server::gateway
