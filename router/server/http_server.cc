#include "router/server/http_server.h"

#include <arpa/inet.h>
#include <event2/buffer.h>
#include <event2/bufferevent.h>
#include <event2/event.h>
#include <event2/http.h>
#include <event2/keyvalq_struct.h>
#include <event2/thread.h>
#include <netinet/in.h>
#include <sys/socket.h>

#include <atomic>
#include <cmath>
#include <csignal>
#include <deque>
#include <string_view>
#include <thread>
#include <variant>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "common/logging.h"
#include "common/metrics.h"
#include "common/status_conversion.h"
#include "common/trace_context.h"
#include "nlohmann/json.hpp"
#include "router/server/openai_json.h"

namespace tandem::router {

using nlohmann::json;

// One HTTP request relayed to the cluster. Lives until both its relay ended (OnDone handled on
// the loop) and the HTTP side is finished.
struct HttpCall final : public ResponseSink {
  HttpServer::Impl* server = nullptr;
  evhttp_request* req = nullptr;  // null once the client went away or the reply ended
  bool chat = false;
  bool stream = false;
  bool include_usage = false;
  std::string id;
  std::string model;
  int64_t created = 0;
  int64_t prompt_tokens = 0;
  std::string text;
  int64_t completion_tokens = 0;
  std::string finish;
  bool sent_role = false;
  bool headers_sent = false;  // a stream's 200 and SSE headers went out
  v1::Usage usage;
  std::shared_ptr<RelayedCall> relay;
  // Fires when the client closes its side, even while nothing reads the socket (a non-streamed
  // request writes only at the end, so a write error would come too late).
  event* closed_watch = nullptr;

  void OnResponse(const v1::GenerateResponse& response) override;
  void OnDone(const absl::Status& status) override;
  void OnAdmitted() override;
};

// A queued request started on a worker (ResponseSink::OnAdmitted).
struct Admitted {};

struct HttpServer::Impl {
  RequestRouter* router = nullptr;
  Options options;
  event_base* base = nullptr;
  evhttp* http = nullptr;
  event* wake = nullptr;
  int port = 0;
  std::thread thread;

  // Relay events handed from gRPC threads to the loop.
  absl::Mutex mu;
  std::deque<std::pair<std::shared_ptr<HttpCall>, std::variant<v1::GenerateResponse, absl::Status, Admitted>>>
      pending ABSL_GUARDED_BY(mu);

  void Post(HttpCall* call, std::variant<v1::GenerateResponse, absl::Status, Admitted> item) {
    {
      absl::MutexLock lock(&mu);
      auto it = calls.find(call);
      if (it == calls.end()) return;
      pending.emplace_back(it->second, std::move(item));
    }
    event_active(wake, EV_READ, 0);
  }
  // The calls in flight, keeping them alive until their relay ended and the reply was sent.
  absl::flat_hash_map<HttpCall*, std::shared_ptr<HttpCall>> calls ABSL_GUARDED_BY(mu);

  void Handle(evhttp_request* req);
  // `span`: the router's span of the request (SpanForHttp).
  void HandleGenerate(evhttp_request* req, bool chat, const TraceContext& span);
  // Hands the relay events posted from gRPC threads to their calls, on the loop.
  void DeliverPending();
  void Deliver(HttpCall& call, const v1::GenerateResponse& response);
  void Finish(HttpCall& call, const absl::Status& status);
  // Sends a stream's 200 and server-sent-event headers on `req` (the call's request), once.
  static void StartStream(HttpCall& call, evhttp_request* req);
  static void StartStream(HttpCall& call) { StartStream(call, call.req); }
  // The call's relay ended: its client's going away cancels nothing any more.
  static void Unwatch(HttpCall* call) {
    if (call->closed_watch != nullptr) {
      event_free(call->closed_watch);
      call->closed_watch = nullptr;
    }
  }
  // The call is over: its relay ended and its reply was written out, or its client went away.
  void Forget(HttpCall* call) {
    Unwatch(call);
    absl::MutexLock lock(&mu);
    calls.erase(call);
  }
  // Set by StartDrain (Drainable); read on the loop.
  std::atomic<bool> draining{false};
};

void HttpCall::OnResponse(const v1::GenerateResponse& response) { server->Post(this, response); }
void HttpCall::OnDone(const absl::Status& status) { server->Post(this, status); }
void HttpCall::OnAdmitted() { server->Post(this, Admitted{}); }

namespace {

void Reply(evhttp_request* req, int code, const std::string& content_type, const std::string& body) {
  evkeyvalq* headers = evhttp_request_get_output_headers(req);
  evhttp_add_header(headers, "Content-Type", content_type.c_str());
  evbuffer* buf = evbuffer_new();
  evbuffer_add(buf, body.data(), body.size());
  evhttp_send_reply(req, code, code == 200 ? "OK" : "Error", buf);
  evbuffer_free(buf);
}

void ReplyError(evhttp_request* req, const absl::Status& status) {
  CountRejected();
  if (std::optional<absl::Duration> after = RetryAfter(status); after.has_value()) {
    evhttp_add_header(evhttp_request_get_output_headers(req), "Retry-After",
                      absl::StrCat(RetryAfterSeconds(*after)).c_str());
  }
  Reply(req, HttpStatusFromCode(status.code()), "application/json", OpenAiErrorBody(status));
}

// 405 with the methods the path takes (no gRPC code maps to it).
void ReplyWrongMethod(evhttp_request* req, const std::string& path, const char* allowed) {
  CountRejected();
  evhttp_add_header(evhttp_request_get_output_headers(req), "Allow", allowed);
  Reply(req, 405, "application/json",
        json{{"error",
              {{"message", absl::StrCat(path, " takes ", allowed)},
               {"type", "invalid_request_error"},
               {"code", "METHOD_NOT_ALLOWED"}}}}
            .dump());
}

void SendChunk(evhttp_request* req, const std::string& data) {
  evbuffer* buf = evbuffer_new();
  evbuffer_add(buf, data.data(), data.size());
  evhttp_send_reply_chunk(req, buf);
  evbuffer_free(buf);
}

// The router's span of a request, from its traceparent and tracestate headers (a new trace when
// it has none or a malformed one); every response to it carries the span in its traceparent
// header.
TraceContext SpanForHttp(evhttp_request* req) {
  std::vector<absl::string_view> traceparents;
  std::vector<absl::string_view> tracestates;
  const evkeyvalq* headers = evhttp_request_get_input_headers(req);
  for (const evkeyval* h = headers->tqh_first; h != nullptr; h = h->next.tqe_next) {
    // The keys are string literals: data() is NUL-terminated.
    if (evutil_ascii_strcasecmp(h->key, kTraceparentKey.data()) == 0) {
      traceparents.push_back(h->value);
    } else if (evutil_ascii_strcasecmp(h->key, kTracestateKey.data()) == 0) {
      tracestates.push_back(h->value);
    }
  }
  absl::Status rejected;
  TraceContext span = SpanForRequest(traceparents, tracestates, &rejected);
  if (!rejected.ok()) {
    LOG(INFO) << TraceTag(span) << "the client's traceparent was not used (" << rejected.message()
              << "); a new trace starts";
  }
  evhttp_add_header(evhttp_request_get_output_headers(req), kTraceparentKey.data(),
                    span.traceparent().c_str());
  return span;
}

std::string Sse(const json& j) {
  return absl::StrCat("data: ", j.dump(-1, ' ', false, json::error_handler_t::replace), "\n\n");
}

}  // namespace

void HttpServer::Impl::Handle(evhttp_request* req) {
  const evhttp_cmd_type method = evhttp_request_get_command(req);
  const evhttp_uri* uri = evhttp_request_get_evhttp_uri(req);
  const std::string path = uri != nullptr && evhttp_uri_get_path(uri) != nullptr
                               ? evhttp_uri_get_path(uri)
                               : "";
  const bool get = method == EVHTTP_REQ_GET || method == EVHTTP_REQ_HEAD;
  const bool draining_now = draining.load();
  // A client kept alive on this router goes to another one for its next request.
  if (draining_now) {
    evhttp_add_header(evhttp_request_get_output_headers(req), "Connection", "close");
  }
  if (path == "/health" || path == "/metrics" || path == "/v1/models") {
    if (!get) return ReplyWrongMethod(req, path, "GET");
  }
  if (path == "/health" && draining_now) {
    Reply(req, 503, "application/json",
          json{{"status", "draining"},
               {"message", "router is draining: it finishes the requests in flight and takes "
                           "no new ones"}}
              .dump());
    return;
  }
  if (path == "/health") {
    const bool ready = router->registry().Ready();
    Reply(req, ready ? 200 : 503, "text/plain", ready ? "ok\n" : "no decode worker is ready\n");
    return;
  }
  if (path == "/metrics") {
    Reply(req, 200, "text/plain; version=0.0.4", SerializeMetrics(ProcessMetrics()));
    return;
  }
  if (path == "/v1/models") {
    Reply(req, 200, "application/json", OpenAiModelList(router->ListModels()));
    return;
  }
  if (path == "/v1/completions" || path == "/v1/chat/completions") {
    const TraceContext span = SpanForHttp(req);  // before any reply: errors carry it too
    if (method != EVHTTP_REQ_POST) return ReplyWrongMethod(req, path, "POST");
    HandleGenerate(req, path == "/v1/chat/completions", span);
    return;
  }
  ReplyError(req, absl::NotFoundError(absl::StrCat("no such path: ", path)));
}

void HttpServer::Impl::HandleGenerate(evhttp_request* req, bool chat, const TraceContext& span) {
  auto refuse = [req, &span](const absl::Status& status) {
    LOG(INFO) << TraceTag(span) << "request refused: " << status;
    ReplyError(req, status);
  };
  evbuffer* input = evhttp_request_get_input_buffer(req);
  std::string raw(evbuffer_get_length(input), '\0');
  evbuffer_copyout(input, raw.data(), raw.size());
  absl::StatusOr<OpenAiRequest> request = ParseOpenAiRequest(raw, chat);
  if (!request.ok()) return refuse(request.status());
  auto call = std::make_shared<HttpCall>();
  call->stream = request->stream;
  call->include_usage = request->include_usage;
  absl::StatusOr<RequestRouter::Prepared> prepared = router->Prepare(request->request, span);
  if (!prepared.ok()) return refuse(prepared.status());
  call->server = this;
  call->req = req;
  call->chat = chat;
  call->id = absl::StrCat(chat ? "chatcmpl-" : "cmpl-", prepared->request.request_id());
  call->model = router->ModelId();
  call->created = absl::ToUnixSeconds(absl::Now());
  call->prompt_tokens = static_cast<int64_t>(prepared->tokens.size());
  {
    absl::MutexLock lock(&mu);
    calls[call.get()] = call;
  }
  absl::StatusOr<std::shared_ptr<RelayedCall>> relay = router->Start(*std::move(prepared), call.get());
  if (!relay.ok()) {
    Forget(call.get());
    return refuse(relay.status());
  }
  call->relay = *relay;
  // A client that goes away cancels the request; the reply must not be touched after that.
  evhttp_connection_set_closecb(
      evhttp_request_get_connection(req),
      [](evhttp_connection*, void* arg) {
        auto* c = static_cast<HttpCall*>(arg);
        c->req = nullptr;
        if (c->relay != nullptr) c->relay->Cancel();
      },
      call.get());
  if (bufferevent* bev = evhttp_connection_get_bufferevent(evhttp_request_get_connection(req));
      bev != nullptr && bufferevent_getfd(bev) >= 0) {
    call->closed_watch = event_new(
        base, bufferevent_getfd(bev), EV_CLOSED,
        [](evutil_socket_t, short, void* arg) {
          auto* c = static_cast<HttpCall*>(arg);
          if (c->relay != nullptr) c->relay->Cancel();
        },
        call.get());
    if (call->closed_watch != nullptr) event_add(call->closed_watch, nullptr);
  }
  // A request waiting in the router's admission queue answers once it starts: a refusal after
  // the wait is then still a plain 429.
  if (call->stream && !call->relay->queued()) StartStream(*call);
}

void HttpServer::Impl::StartStream(HttpCall& call, evhttp_request* req) {
  if (call.headers_sent || req == nullptr) return;
  call.headers_sent = true;
  evkeyvalq* headers = evhttp_request_get_output_headers(req);
  evhttp_add_header(headers, "Content-Type", "text/event-stream");
  evhttp_add_header(headers, "Cache-Control", "no-cache");
  evhttp_send_reply_start(req, 200, "OK");
}

void HttpServer::Impl::DeliverPending() {
  std::deque<std::pair<std::shared_ptr<HttpCall>, std::variant<v1::GenerateResponse, absl::Status, Admitted>>>
      items;
  {
    absl::MutexLock lock(&mu);
    items.swap(pending);
  }
  for (auto& [call, item] : items) {
    if (auto* r = std::get_if<v1::GenerateResponse>(&item)) {
      Deliver(*call, *r);
    } else if (std::holds_alternative<Admitted>(item)) {
      if (call->stream) StartStream(*call);
    } else {
      Finish(*call, std::get<absl::Status>(item));
    }
  }
}

void HttpServer::Impl::Deliver(HttpCall& call, const v1::GenerateResponse& r) {
  call.completion_tokens += r.token_ids_size();
  if (r.finish_reason() != v1::FINISH_REASON_UNSPECIFIED) call.finish = OpenAiFinishReason(r.finish_reason());
  if (r.has_usage()) call.usage = r.usage();
  if (!call.stream) {
    call.text += r.text();
    return;
  }
  if (call.req == nullptr) return;
  StartStream(call);
  if (r.text().empty() && call.finish.empty()) return;
  json choice = {{"index", 0}, {"logprobs", nullptr},
                 {"finish_reason", call.finish.empty() ? json(nullptr) : json(call.finish)}};
  if (call.chat) {
    json delta = {{"content", r.text()}};
    if (!call.sent_role) delta["role"] = "assistant";
    call.sent_role = true;
    choice["delta"] = delta;
  } else {
    choice["text"] = r.text();
  }
  SendChunk(call.req, Sse({{"id", call.id},
                           {"object", call.chat ? "chat.completion.chunk" : "text_completion"},
                           {"created", call.created},
                           {"model", call.model},
                           {"choices", json::array({choice})}}));
}

void HttpServer::Impl::Finish(HttpCall& call, const absl::Status& status) {
  evhttp_request* req = call.req;
  call.req = nullptr;
  Unwatch(&call);
  if (req == nullptr) return Forget(&call);  // the client went away
  // The call stays in flight until its reply is written out (a drain waits for that), or until
  // its client goes away first. Either callback may run inside the evhttp_send_* below; the
  // caller (DeliverPending) holds a reference to the call.
  evhttp_connection_set_closecb(
      evhttp_request_get_connection(req),
      [](evhttp_connection*, void* arg) {
        auto* c = static_cast<HttpCall*>(arg);
        c->server->Forget(c);
      },
      &call);
  evhttp_request_set_on_complete_cb(
      req,
      [](evhttp_request* done, void* arg) {
        auto* c = static_cast<HttpCall*>(arg);
        // The connection may serve further requests: it must not call back into this call.
        evhttp_connection_set_closecb(evhttp_request_get_connection(done), nullptr, nullptr);
        c->server->Forget(c);
      },
      &call);
  const json usage = {{"prompt_tokens", call.prompt_tokens},
                      {"completion_tokens", call.completion_tokens},
                      {"total_tokens", call.prompt_tokens + call.completion_tokens}};
  if (call.stream && !call.headers_sent && !status.ok()) {
    ReplyError(req, status);  // refused before it started: a plain HTTP error
  } else if (call.stream) {
    StartStream(call, req);  // call.req is already cleared
    if (!status.ok()) {
      SendChunk(req, Sse(json::parse(OpenAiErrorBody(status))));
    } else if (call.include_usage) {
      SendChunk(req, Sse({{"id", call.id},
                          {"object", call.chat ? "chat.completion.chunk" : "text_completion"},
                          {"created", call.created},
                          {"model", call.model},
                          {"choices", json::array()},
                          {"usage", usage}}));
    }
    SendChunk(req, "data: [DONE]\n\n");
    evhttp_send_reply_end(req);
  } else if (!status.ok()) {
    ReplyError(req, status);
  } else {
    json choice = {{"index", 0}, {"logprobs", nullptr}, {"finish_reason", call.finish}};
    if (call.chat) {
      choice["message"] = {{"role", "assistant"}, {"content", call.text}};
    } else {
      choice["text"] = call.text;
    }
    Reply(req, 200, "application/json",
          json{{"id", call.id},
               {"object", call.chat ? "chat.completion" : "text_completion"},
               {"created", call.created},
               {"model", call.model},
               {"choices", json::array({choice})},
               {"usage", usage}}
              .dump(-1, ' ', false, json::error_handler_t::replace));
  }
}

HttpServer::HttpServer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

absl::StatusOr<std::unique_ptr<HttpServer>> HttpServer::Start(RequestRouter* router,
                                                              const Options& options) {
  static const bool threads = [] { return evthread_use_pthreads() == 0; }();
  // libevent writes with write(2): a client that resets its connection must give EPIPE here, not
  // kill the process (the binaries also ignore SIGPIPE; this covers embedders and tests).
  std::signal(SIGPIPE, SIG_IGN);
  if (!threads) return absl::InternalError("libevent has no pthreads support");
  const size_t colon = options.listen.rfind(':');
  int port = 0;
  if (colon == std::string::npos || !absl::SimpleAtoi(options.listen.substr(colon + 1), &port) ||
      port < 0 || port > 65535) {
    return absl::InvalidArgumentError(absl::StrCat("bad HTTP address '", options.listen, "'"));
  }
  auto impl = std::make_unique<Impl>();
  impl->router = router;
  impl->options = options;
  impl->base = event_base_new();
  impl->http = evhttp_new(impl->base);
  evhttp_set_max_body_size(impl->http, options.max_body_bytes);
  // Every method reaches Handle, which answers a wrong one with 405.
  evhttp_set_allowed_methods(impl->http, EVHTTP_REQ_GET | EVHTTP_REQ_POST | EVHTTP_REQ_HEAD |
                                             EVHTTP_REQ_PUT | EVHTTP_REQ_DELETE |
                                             EVHTTP_REQ_OPTIONS | EVHTTP_REQ_PATCH);
  // Read what is left of a refused upload before closing, so the client sees the 413.
  evhttp_set_flags(impl->http, EVHTTP_SERVER_LINGERING_CLOSE);
  evhttp_set_timeout(impl->http, 3600);
  evhttp_set_gencb(
      impl->http, [](evhttp_request* req, void* arg) { static_cast<Impl*>(arg)->Handle(req); },
      impl.get());
  const std::string host = options.listen.substr(0, colon);
  evhttp_bound_socket* bound = evhttp_bind_socket_with_handle(
      impl->http, host.empty() ? "0.0.0.0" : host.c_str(), static_cast<uint16_t>(port));
  if (bound == nullptr) {
    evhttp_free(impl->http);
    event_base_free(impl->base);
    return absl::UnavailableError(absl::StrCat("cannot listen on ", options.listen));
  }
  sockaddr_in addr{};
  socklen_t len = sizeof(addr);
  getsockname(evhttp_bound_socket_get_fd(bound), reinterpret_cast<sockaddr*>(&addr), &len);
  impl->port = ntohs(addr.sin_port);
  impl->wake = event_new(
      impl->base, -1, EV_PERSIST | EV_READ,
      [](evutil_socket_t, short, void* arg) { static_cast<Impl*>(arg)->DeliverPending(); },
      impl.get());
  event_add(impl->wake, nullptr);
  Impl* raw = impl.get();
  impl->thread = std::thread([raw] { event_base_loop(raw->base, EVLOOP_NO_EXIT_ON_EMPTY); });
  return std::unique_ptr<HttpServer>(new HttpServer(std::move(impl)));
}

HttpServer::~HttpServer() {
  // Cancel what is in flight, let the relays end, then stop the loop.
  std::vector<std::shared_ptr<HttpCall>> open;
  {
    absl::MutexLock lock(&impl_->mu);
    for (auto& [raw, call] : impl_->calls) open.push_back(call);
  }
  for (auto& call : open) {
    if (call->relay != nullptr) call->relay->Cancel();
  }
  const absl::Time until = absl::Now() + absl::Seconds(5);
  while (absl::Now() < until) {
    absl::MutexLock lock(&impl_->mu);
    if (impl_->calls.empty()) break;
    impl_->mu.AwaitWithTimeout(absl::Condition(+[](Impl* i) ABSL_EXCLUSIVE_LOCKS_REQUIRED(i->mu) {
                                 return i->calls.empty();
                               }, impl_.get()),
                               absl::Milliseconds(50));
  }
  event_base_loopexit(impl_->base, nullptr);
  impl_->thread.join();
  event_free(impl_->wake);
  evhttp_free(impl_->http);
  event_base_free(impl_->base);
}

int HttpServer::port() const { return impl_->port; }

void HttpServer::StartDrain() {
  impl_->draining.store(true);
  LOG(INFO) << "draining: GET /health answers 503 and new HTTP requests are refused";
}

bool HttpServer::AwaitIdle(absl::Time deadline) {
  absl::MutexLock lock(&impl_->mu);
  auto idle = +[](Impl* i) ABSL_EXCLUSIVE_LOCKS_REQUIRED(i->mu) { return i->calls.empty(); };
  return impl_->mu.AwaitWithDeadline(absl::Condition(idle, impl_.get()), deadline);
}

void HttpServer::HandOff() {
  absl::MutexLock lock(&impl_->mu);
  if (!impl_->calls.empty()) {
    LOG(INFO) << impl_->calls.size() << " HTTP requests still open: their ends are written "
              << "before the server stops";
  }
}

}  // namespace tandem::router
