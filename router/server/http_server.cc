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
#include "engine/tokenizer/unicode.h"
#include "router/server/openai_json.h"
#include "router/server/tool_calls.h"

namespace tandem::router {

using nlohmann::json;

struct HttpCall;

// One candidate of an HTTP request: its own request relayed to the cluster (n and best_of fan
// out one per candidate, with distinct seeds). Its events go to the loop tagged with its index.
struct Candidate final : public ResponseSink {
  HttpCall* call = nullptr;
  int index = 0;   // its choice's index when streamed (prompt · n + j; best_of is n then)
  int prompt = 0;  // which of the call's prompts it completes
  std::shared_ptr<RelayedCall> relay;
  bool done = false;  // its relay ended
  std::string text;   // not streamed: the whole text
  std::vector<TokenWithLogprobs> logprobs;  // not streamed: every token's
  std::vector<TokenWithLogprobs> prompt_logprobs;  // not streamed, echo: the prompt's tokens'
  bool echoed = false;                      // echo: the prompt went out (or into `text`)
  double cumulative_logprob = 0;            // of every token generated (ranks best_of)
  int64_t logprob_chars = 0;                // streamed: characters of the tokens sent (text_offset)
  int64_t completion_tokens = 0;
  int64_t cached_tokens = 0;
  std::string finish;
  bool sent_role = false;
  // Streamed chat with tools: the output split into content and calls as it comes.
  std::unique_ptr<ToolCallParser> tool_parser;
  int tool_calls_sent = 0;

  void OnResponse(const v1::GenerateResponse& response) override;
  void OnDone(const absl::Status& status) override;
  void OnAdmitted() override;
};

// One HTTP request relayed to the cluster. Lives until every candidate's relay ended (OnDone
// handled on the loop) and the HTTP side is finished.
struct HttpCall {
  HttpServer::Impl* server = nullptr;
  evhttp_request* req = nullptr;  // null once the client went away or the reply ended
  bool chat = false;
  bool stream = false;
  bool include_usage = false;
  int n = 1;                     // choices returned
  std::optional<int> logprobs;   // alternatives per token asked for; nullopt: no logprobs
  bool echo = false;             // completions' echo: the prompt's text (and tokens) first
  bool max_tokens_zero = false;  // max_tokens 0: the one generated token is dropped
  // Chat with tools and tool_choice other than "none": the output is parsed for calls of these.
  bool tools = false;
  absl::flat_hash_set<std::string> tool_names;
  ToolCallFormat tool_format = ToolCallFormat::kHermes;
  // Each prompt's tokens and, for echo, its text (completions may send a batch of prompts).
  struct Prompt {
    std::vector<int32_t> ids;
    std::string echo_text;
  };
  std::vector<Prompt> prompts;
  std::string id;
  std::string model;
  int64_t created = 0;
  bool headers_sent = false;  // a stream's 200 and SSE headers went out
  std::vector<std::unique_ptr<Candidate>> candidates;
  int open = 0;               // candidates whose relay has not ended
  absl::Status error;         // the first candidate's error; the others are cancelled
  // Fires when the client closes its side, even while nothing reads the socket (a non-streamed
  // request writes only at the end, so a write error would come too late).
  event* closed_watch = nullptr;
  auth::TenantLease lease;  // the tenant's place among its concurrent requests, until the end

  void CancelAll() {
    for (auto& c : candidates) {
      if (c->relay != nullptr && !c->done) c->relay->Cancel();
    }
  }
};

// A queued request started on a worker (ResponseSink::OnAdmitted).
struct Admitted {};

using RelayEvent = std::variant<v1::GenerateResponse, absl::Status, Admitted>;

struct HttpServer::Impl {
  RequestRouter* router = nullptr;
  Options options;
  event_base* base = nullptr;
  evhttp* http = nullptr;
  event* wake = nullptr;
  int port = 0;
  std::thread thread;

  // Relay events handed from gRPC threads to the loop: the call, the candidate's index, the event.
  absl::Mutex mu;
  struct Pending {
    std::shared_ptr<HttpCall> call;
    int candidate;
    RelayEvent event;
  };
  std::deque<Pending> pending ABSL_GUARDED_BY(mu);

  void Post(HttpCall* call, int candidate, RelayEvent item) {
    {
      absl::MutexLock lock(&mu);
      auto it = calls.find(call);
      if (it == calls.end()) return;
      pending.push_back({it->second, candidate, std::move(item)});
    }
    event_active(wake, EV_READ, 0);
  }
  // The calls in flight, keeping them alive until their relays ended and the reply was sent.
  absl::flat_hash_map<HttpCall*, std::shared_ptr<HttpCall>> calls ABSL_GUARDED_BY(mu);

  void Handle(evhttp_request* req);
  // `span`: the router's span of the request (SpanForHttp).
  void HandleGenerate(evhttp_request* req, bool chat, const TraceContext& span,
                      auth::TenantLease lease);
  // POST /tokenize and /detokenize.
  void HandleTokenize(evhttp_request* req);
  void HandleDetokenize(evhttp_request* req);
  // Hands the relay events posted from gRPC threads to their calls, on the loop.
  void DeliverPending();
  void Deliver(HttpCall& call, Candidate& candidate, const v1::GenerateResponse& response);
  // A candidate's relay ended; the last one finishes the call.
  void CandidateDone(HttpCall& call, Candidate& candidate, const absl::Status& status);
  void Finish(HttpCall& call, const absl::Status& status);
  // The log-probabilities of `response`'s tokens, with their texts.
  std::vector<TokenWithLogprobs> Logprobs(const v1::GenerateResponse& response) const;
  // Echo: the prompt's tokens with their log-probabilities from `response` (the first message);
  // the first token's value is a placeholder that EchoLogprobs makes null.
  std::vector<TokenWithLogprobs> PromptLogprobs(const HttpCall::Prompt& prompt,
                                                const v1::GenerateResponse& response) const;
  // A streamed chat with tools: `text` through the candidate's parser, sent as content and
  // tool_calls deltas (one chunk each; the first carries `choice`'s logprobs, the last its
  // finish_reason, "tool_calls" when the output had calls).
  void StreamToolDeltas(HttpCall& call, Candidate& c, const std::string& text, json choice);
  // Sends a stream's 200 and server-sent-event headers on `req` (the call's request), once.
  static void StartStream(HttpCall& call, evhttp_request* req);
  static void StartStream(HttpCall& call) { StartStream(call, call.req); }
  // The call's relays ended: its client's going away cancels nothing any more.
  static void Unwatch(HttpCall* call) {
    if (call->closed_watch != nullptr) {
      event_free(call->closed_watch);
      call->closed_watch = nullptr;
    }
  }
  // The call is over: its relays ended and its reply was written out, or its client went away.
  void Forget(HttpCall* call) {
    Unwatch(call);
    absl::MutexLock lock(&mu);
    calls.erase(call);
  }
  // Set by StartDrain (Drainable); read on the loop.
  std::atomic<bool> draining{false};
};

void Candidate::OnResponse(const v1::GenerateResponse& response) {
  call->server->Post(call, index, response);
}
void Candidate::OnDone(const absl::Status& status) { call->server->Post(call, index, status); }
void Candidate::OnAdmitted() { call->server->Post(call, index, Admitted{}); }

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
  if (status.code() == absl::StatusCode::kUnauthenticated) {  // RFC 6750
    evhttp_add_header(evhttp_request_get_output_headers(req), "WWW-Authenticate", "Bearer");
  }
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
               {"param", nullptr},
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

std::string BodyOf(evhttp_request* req) {
  evbuffer* input = evhttp_request_get_input_buffer(req);
  std::string raw(evbuffer_get_length(input), '\0');
  evbuffer_copyout(input, raw.data(), raw.size());
  return raw;
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
  // The door (router/auth): a key unless the path is open; the lease holds the tenant's place
  // until the reply is written (the call's, for a generation).
  auth::TenantLease lease;
  if (options.api_keys != nullptr) {
    const char* authorization =
        evhttp_find_header(evhttp_request_get_input_headers(req), "Authorization");
    absl::StatusOr<auth::TenantLease> admitted = options.api_keys->AdmitHttp(
        path, authorization != nullptr ? std::optional<absl::string_view>(authorization)
                                       : std::nullopt);
    if (!admitted.ok()) return ReplyError(req, admitted.status());
    lease = *std::move(admitted);
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
  if (path == "/tokenize" || path == "/detokenize") {
    if (method != EVHTTP_REQ_POST) return ReplyWrongMethod(req, path, "POST");
    return path == "/tokenize" ? HandleTokenize(req) : HandleDetokenize(req);
  }
  if (path == "/v1/completions" || path == "/v1/chat/completions") {
    const TraceContext span = SpanForHttp(req);  // before any reply: errors carry it too
    if (method != EVHTTP_REQ_POST) return ReplyWrongMethod(req, path, "POST");
    HandleGenerate(req, path == "/v1/chat/completions", span, std::move(lease));
    return;
  }
  ReplyError(req, absl::NotFoundError(absl::StrCat("no such path: ", path)));
}

void HttpServer::Impl::HandleGenerate(evhttp_request* req, bool chat, const TraceContext& span,
                                      auth::TenantLease lease) {
  auto refuse = [req, &span](const absl::Status& status) {
    LOG(INFO) << TraceTag(span) << "request refused: " << status;
    ReplyError(req, status);
  };
  absl::StatusOr<OpenAiRequest> request = ParseOpenAiRequest(BodyOf(req), chat);
  if (!request.ok()) return refuse(request.status());
  // One prompt, or completions' batch of them; each is prepared (tokenized, checked) before any
  // starts, so that a bad one refuses the whole request.
  std::vector<v1::GenerateRequest> inputs = std::move(request->batch);
  if (inputs.empty()) inputs.push_back(request->request);
  std::vector<RequestRouter::Prepared> prepared;
  for (size_t p = 0; p < inputs.size(); ++p) {
    absl::StatusOr<RequestRouter::Prepared> one = router->Prepare(inputs[p], span);
    if (!one.ok()) {
      // The router names the prompt; a chat's is its messages, a batch's the one at fault.
      std::string param = ParamOf(one.status()).value_or("");
      if (chat && param == "prompt") param = "messages";
      if (inputs.size() > 1 && param == "prompt") param = absl::StrCat("prompt[", p, "]");
      return refuse(param.empty() ? one.status() : WithParam(one.status(), param));
    }
    prepared.push_back(*std::move(one));
  }
  auto call = std::make_shared<HttpCall>();
  call->lease = std::move(lease);
  call->stream = request->stream;
  call->include_usage = request->include_usage;
  call->n = request->n;
  call->logprobs = request->logprobs;
  call->echo = request->echo;
  call->max_tokens_zero = request->max_tokens_zero;
  call->tools = chat && ParsesToolCalls(request->request);
  if (call->tools) call->tool_names = ToolNames(request->request);
  call->tool_format = router->tool_call_format();
  for (size_t p = 0; p < inputs.size(); ++p) {
    HttpCall::Prompt& prompt = call->prompts.emplace_back();
    prompt.ids = prepared[p].tokens;
    if (call->echo) {
      prompt.echo_text = inputs[p].has_prompt() ? inputs[p].prompt()
                                                : router->tokenizer().Decode(prepared[p].tokens);
    }
  }
  call->server = this;
  call->req = req;
  call->chat = chat;
  const std::string& request_id = prepared[0].request.request_id();
  call->id = absl::StrCat(chat ? "chatcmpl-" : "cmpl-", request_id);
  call->model = router->ModelId();
  call->created = absl::ToUnixSeconds(absl::Now());
  // best_of candidates per prompt, prompt by prompt.
  const int per_prompt = request->best_of;
  for (size_t p = 0; p < inputs.size(); ++p) {
    for (int i = 0; i < per_prompt; ++i) {
      auto c = std::make_unique<Candidate>();
      c->call = call.get();
      c->prompt = static_cast<int>(p);
      c->index = static_cast<int>(p) * per_prompt + i;
      if (call->tools && call->stream) {
        c->tool_parser = std::make_unique<ToolCallParser>(call->tool_names, call->tool_format);
      }
      call->candidates.push_back(std::move(c));
    }
  }
  {
    absl::MutexLock lock(&mu);
    calls[call.get()] = call;
  }
  // One request per candidate: candidate i of a prompt has the client's seed plus i (distinct
  // outputs that the same request repeats), or the workers' random one.
  const int total = static_cast<int>(call->candidates.size());
  for (int k = 0; k < total; ++k) {
    Candidate& c = *call->candidates[k];
    const int i = k % per_prompt;
    RequestRouter::Prepared one = prepared[static_cast<size_t>(c.prompt)];
    if (total > 1) {
      one.request.set_request_id(absl::StrCat(request_id, "-", k));
      if (one.request.sampling().has_seed()) {
        one.request.mutable_sampling()->set_seed(one.request.sampling().seed() + i);
      }
    }
    absl::StatusOr<std::shared_ptr<RelayedCall>> relay = router->Start(std::move(one), &c);
    if (!relay.ok()) {
      if (k == 0) {
        Forget(call.get());
        return refuse(relay.status());
      }
      // The started ones end cancelled; the last to end replies with this error.
      c.done = true;
      call->error = relay.status();
      call->CancelAll();
      break;
    }
    c.relay = *relay;
    ++call->open;
  }
  // A client that goes away cancels the request; the reply must not be touched after that.
  evhttp_connection_set_closecb(
      evhttp_request_get_connection(req),
      [](evhttp_connection*, void* arg) {
        auto* c = static_cast<HttpCall*>(arg);
        c->req = nullptr;
        c->CancelAll();
      },
      call.get());
  if (bufferevent* bev = evhttp_connection_get_bufferevent(evhttp_request_get_connection(req));
      bev != nullptr && bufferevent_getfd(bev) >= 0) {
    call->closed_watch = event_new(
        base, bufferevent_getfd(bev), EV_CLOSED,
        [](evutil_socket_t, short, void* arg) { static_cast<HttpCall*>(arg)->CancelAll(); },
        call.get());
    if (call->closed_watch != nullptr) event_add(call->closed_watch, nullptr);
  }
  // A request waiting in the router's admission queue answers once it starts: a refusal after
  // the wait is then still a plain 429.
  if (call->stream && call->error.ok() && !call->candidates[0]->relay->queued()) {
    StartStream(*call);
  }
}

void HttpServer::Impl::HandleTokenize(evhttp_request* req) {
  absl::StatusOr<v1::TokenizeRequest> request = ParseTokenizeRequest(BodyOf(req));
  if (!request.ok()) return ReplyError(req, request.status());
  absl::StatusOr<v1::TokenizeResponse> tokens = router->Tokenize(*request);
  if (!tokens.ok()) return ReplyError(req, tokens.status());
  json body = {{"tokens", tokens->token_ids()},
               {"count", tokens->token_ids_size()},
               {"max_model_len", tokens->max_model_len()}};
  if (request->return_pieces()) body["token_strs"] = tokens->pieces();
  Reply(req, 200, "application/json", body.dump(-1, ' ', false, json::error_handler_t::replace));
}

void HttpServer::Impl::HandleDetokenize(evhttp_request* req) {
  absl::StatusOr<DetokenizeRequest> request = ParseDetokenizeRequest(BodyOf(req));
  if (!request.ok()) return ReplyError(req, request.status());
  if (!request->model.empty() && request->model != router->ModelId()) {
    return ReplyError(req, WithParam(absl::NotFoundError(absl::StrCat(
                                         "model '", request->model, "' does not exist")),
                                     "model"));
  }
  const Tokenizer& tokenizer = router->tokenizer();
  for (int32_t id : request->tokens) {
    if (id >= tokenizer.vocab_size()) {
      return ReplyError(req, WithParam(absl::InvalidArgumentError(absl::StrCat(
                                           "'tokens': id ", id, " is outside the vocabulary [0, ",
                                           tokenizer.vocab_size(), ")")),
                                       "tokens"));
    }
  }
  Reply(req, 200, "application/json",
        json{{"prompt", SanitizeUtf8(tokenizer.Decode(request->tokens))}}.dump());
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
  std::deque<Pending> items;
  {
    absl::MutexLock lock(&mu);
    items.swap(pending);
  }
  for (Pending& p : items) {
    HttpCall& call = *p.call;
    Candidate& candidate = *call.candidates[p.candidate];
    if (auto* r = std::get_if<v1::GenerateResponse>(&p.event)) {
      Deliver(call, candidate, *r);
    } else if (std::holds_alternative<Admitted>(p.event)) {
      if (call.stream && call.error.ok()) StartStream(call);
    } else {
      CandidateDone(call, candidate, std::get<absl::Status>(p.event));
    }
  }
}

namespace {

// One token's log-probabilities with the tokens' bytes for their ids.
TokenWithLogprobs WithText(const Tokenizer& tokenizer, const v1::TokenLogprobs& lp) {
  TokenWithLogprobs t{.token = tokenizer.TokenBytes(lp.token_id()), .logprob = lp.logprob(),
                      .top = {}};
  for (const v1::TopLogprob& top : lp.top_logprobs()) {
    t.top.emplace_back(tokenizer.TokenBytes(top.token_id()), top.logprob());
  }
  return t;
}

}  // namespace

std::vector<TokenWithLogprobs> HttpServer::Impl::Logprobs(const v1::GenerateResponse& r) const {
  const Tokenizer& tokenizer = router->tokenizer();
  std::vector<TokenWithLogprobs> out;
  out.reserve(static_cast<size_t>(r.logprobs_size()));
  for (const v1::TokenLogprobs& lp : r.logprobs()) out.push_back(WithText(tokenizer, lp));
  return out;
}

std::vector<TokenWithLogprobs> HttpServer::Impl::PromptLogprobs(
    const HttpCall::Prompt& prompt, const v1::GenerateResponse& r) const {
  const Tokenizer& tokenizer = router->tokenizer();
  std::vector<TokenWithLogprobs> out;
  if (prompt.ids.empty()) return out;
  out.push_back({.token = tokenizer.TokenBytes(prompt.ids[0]), .logprob = 0, .top = {}});
  for (const v1::TokenLogprobs& lp : r.prompt_logprobs()) out.push_back(WithText(tokenizer, lp));
  return out;
}

namespace {

// Completions' "logprobs" of an echoed choice: the prompt's tokens (offsets from 0; the first
// one, which has no context, with null values as OpenAI's API), then the generated ones (offsets
// from `generated_offset`, the echoed text's length plus what was generated before).
json EchoLogprobs(const std::vector<TokenWithLogprobs>& prompt,
                  const std::vector<TokenWithLogprobs>& generated, int top_n,
                  int64_t generated_offset) {
  json out = CompletionLogprobs(prompt, top_n, 0);
  if (!prompt.empty()) {
    out["token_logprobs"][0] = nullptr;
    out["top_logprobs"][0] = nullptr;
  }
  const json more = CompletionLogprobs(generated, top_n, generated_offset);
  for (auto it = more.begin(); it != more.end(); ++it) {
    for (const json& v : it.value()) out[it.key()].push_back(v);
  }
  return out;
}

}  // namespace

void HttpServer::Impl::Deliver(HttpCall& call, Candidate& c, const v1::GenerateResponse& r) {
  // max_tokens 0: the engine's one token is not part of the reply.
  const bool keep = !call.max_tokens_zero;
  if (keep) c.completion_tokens += r.token_ids_size();
  if (r.finish_reason() != v1::FINISH_REASON_UNSPECIFIED) {
    c.finish = keep || r.finish_reason() == v1::FINISH_REASON_ERROR
                   ? OpenAiFinishReason(r.finish_reason())
                   : "length";
  }
  if (r.has_usage()) c.cached_tokens = r.usage().cached_prompt_tokens();
  if (keep) {
    for (const v1::TokenLogprobs& lp : r.logprobs()) c.cumulative_logprob += lp.logprob();
  }
  std::string text;
  std::vector<TokenWithLogprobs> prompt_logprobs;  // echo, the first message: the prompt's
  bool echo_now = false;
  if (call.echo && !c.echoed) {
    c.echoed = echo_now = true;
    text = call.prompts[c.prompt].echo_text;
    if (call.logprobs.has_value()) prompt_logprobs = PromptLogprobs(call.prompts[c.prompt], r);
  }
  std::vector<TokenWithLogprobs> logprobs;
  if (keep) {
    text += r.text();
    if (call.logprobs.has_value()) logprobs = Logprobs(r);
  }
  if (!call.stream) {
    c.text += text;
    if (echo_now) c.prompt_logprobs = std::move(prompt_logprobs);
    for (TokenWithLogprobs& t : logprobs) c.logprobs.push_back(std::move(t));
    return;
  }
  if (call.req == nullptr || !call.error.ok()) return;
  StartStream(call);
  if (text.empty() && c.finish.empty() && logprobs.empty() && prompt_logprobs.empty()) return;
  json choice = {{"index", c.index},
                 {"logprobs", nullptr},
                 {"finish_reason", c.finish.empty() ? json(nullptr) : json(c.finish)}};
  if (echo_now) c.logprob_chars = CountCharacters(call.prompts[c.prompt].echo_text);
  if (call.logprobs.has_value()) {
    choice["logprobs"] =
        call.chat ? ChatLogprobs(logprobs, *call.logprobs)
        : echo_now ? EchoLogprobs(prompt_logprobs, logprobs, *call.logprobs, c.logprob_chars)
                   : CompletionLogprobs(logprobs, *call.logprobs, c.logprob_chars);
    for (const TokenWithLogprobs& t : logprobs) c.logprob_chars += CountCharacters(t.token);
  }
  if (c.tool_parser != nullptr) return StreamToolDeltas(call, c, r.text(), std::move(choice));
  if (call.chat) {
    json delta = {{"content", r.text()}};
    if (!c.sent_role) delta["role"] = "assistant";
    c.sent_role = true;
    choice["delta"] = delta;
  } else {
    choice["text"] = text;
  }
  SendChunk(call.req, Sse({{"id", call.id},
                           {"object", call.chat ? "chat.completion.chunk" : "text_completion"},
                           {"created", call.created},
                           {"model", call.model},
                           {"choices", json::array({choice})}}));
}

namespace {

// A finish reason with calls in the output: "tool_calls" (unless it ended in an error or abort).
std::string FinishWithCalls(const std::string& finish, bool calls) {
  return calls && (finish == "stop" || finish == "length") ? "tool_calls" : finish;
}

json ToolCallJson(const ParsedToolCall& call, ToolCallFormat format) {
  return {{"id", NewToolCallId(format)},
          {"type", "function"},
          {"function", {{"name", call.name}, {"arguments", call.arguments}}}};
}

}  // namespace

void HttpServer::Impl::StreamToolDeltas(HttpCall& call, Candidate& c, const std::string& text,
                                        json choice) {
  std::vector<ToolCallParser::Piece> pieces = c.tool_parser->Feed(text);
  if (!c.finish.empty()) {
    for (ToolCallParser::Piece& p : c.tool_parser->Finish()) pieces.push_back(std::move(p));
    c.finish = FinishWithCalls(c.finish, c.tool_parser->calls() > 0);
  }
  std::vector<json> deltas;
  for (const ToolCallParser::Piece& p : pieces) {
    if (p.call.has_value()) {
      json entry = ToolCallJson(*p.call, call.tool_format);
      entry["index"] = c.tool_calls_sent++;
      deltas.push_back({{"tool_calls", json::array({std::move(entry)})}});
    } else {
      deltas.push_back({{"content", p.content}});
    }
  }
  const bool has_logprobs = choice.contains("logprobs") && !choice["logprobs"].is_null();
  if (deltas.empty() && (!c.sent_role || !c.finish.empty() || has_logprobs)) {
    deltas.push_back(json::object());
  }
  for (size_t i = 0; i < deltas.size(); ++i) {
    json one = {{"index", c.index},
                {"logprobs", i == 0 ? choice["logprobs"] : json(nullptr)},
                {"finish_reason", i + 1 == deltas.size() && !c.finish.empty() ? json(c.finish)
                                                                              : json(nullptr)}};
    if (!c.sent_role) deltas[i]["role"] = "assistant";
    c.sent_role = true;
    one["delta"] = std::move(deltas[i]);
    SendChunk(call.req, Sse({{"id", call.id},
                             {"object", "chat.completion.chunk"},
                             {"created", call.created},
                             {"model", call.model},
                             {"choices", json::array({std::move(one)})}}));
  }
}

void HttpServer::Impl::CandidateDone(HttpCall& call, Candidate& c, const absl::Status& status) {
  c.done = true;
  --call.open;
  if (!status.ok() && call.error.ok()) {
    call.error = status;
    call.CancelAll();  // one failed: the reply is the error
  }
  if (call.open == 0) Finish(call, call.error);
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
  // Each prompt counts once (its cached tokens as its best candidate found them); every
  // candidate's tokens count (best_of's too).
  int64_t prompt_tokens = 0;
  int64_t completion_tokens = 0;
  int64_t cached_tokens = 0;
  std::vector<int64_t> cached(call.prompts.size(), 0);
  for (const HttpCall::Prompt& p : call.prompts) prompt_tokens += static_cast<int64_t>(p.ids.size());
  for (const auto& c : call.candidates) {
    completion_tokens += c->completion_tokens;
    int64_t& best = cached[static_cast<size_t>(c->prompt)];
    best = std::max(best, c->cached_tokens);
  }
  for (int64_t c : cached) cached_tokens += c;
  const json usage = {{"prompt_tokens", prompt_tokens},
                      {"completion_tokens", completion_tokens},
                      {"total_tokens", prompt_tokens + completion_tokens},
                      {"prompt_tokens_details", {{"cached_tokens", cached_tokens}}}};
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
    // Prompt by prompt, best_of: the n candidates with the highest cumulative log-probability,
    // best first.
    std::vector<const Candidate*> chosen;
    const size_t per_prompt = call.candidates.size() / call.prompts.size();
    for (size_t first = 0; first < call.candidates.size(); first += per_prompt) {
      std::vector<const Candidate*> group;
      for (size_t k = first; k < first + per_prompt; ++k) group.push_back(call.candidates[k].get());
      if (static_cast<int>(group.size()) > call.n) {
        std::stable_sort(group.begin(), group.end(), [](const Candidate* a, const Candidate* b) {
          return a->cumulative_logprob > b->cumulative_logprob;
        });
        group.resize(static_cast<size_t>(call.n));
      }
      chosen.insert(chosen.end(), group.begin(), group.end());
    }
    json choices = json::array();
    for (size_t i = 0; i < chosen.size(); ++i) {
      const Candidate& c = *chosen[i];
      std::optional<ParsedOutput> parsed;
      if (call.tools) parsed = ParseToolCalls(c.text, call.tool_names, call.tool_format);
      json choice = {{"index", i},
                     {"logprobs", nullptr},
                     {"finish_reason",
                      FinishWithCalls(c.finish, parsed.has_value() && !parsed->calls.empty())}};
      if (call.logprobs.has_value()) {
        choice["logprobs"] =
            call.chat ? ChatLogprobs(c.logprobs, *call.logprobs)
            : call.echo
                ? EchoLogprobs(c.prompt_logprobs, c.logprobs, *call.logprobs,
                               CountCharacters(call.prompts[c.prompt].echo_text))
                : CompletionLogprobs(c.logprobs, *call.logprobs, 0);
      }
      if (parsed.has_value()) {
        choice["message"] = {{"role", "assistant"},
                             {"content", parsed->content.has_value() ? json(*parsed->content)
                                                                     : json(nullptr)}};
        if (!parsed->calls.empty()) {
          json calls = json::array();
          for (const ParsedToolCall& t : parsed->calls) {
            calls.push_back(ToolCallJson(t, call.tool_format));
          }
          choice["message"]["tool_calls"] = std::move(calls);
        }
      } else if (call.chat) {
        choice["message"] = {{"role", "assistant"}, {"content", c.text}};
      } else {
        choice["text"] = c.text;
      }
      choices.push_back(std::move(choice));
    }
    Reply(req, 200, "application/json",
          json{{"id", call.id},
               {"object", call.chat ? "chat.completion" : "text_completion"},
               {"created", call.created},
               {"model", call.model},
               {"choices", std::move(choices)},
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
  for (auto& call : open) call->CancelAll();
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
