// The router's OpenAI-compatible HTTP API, on one libevent loop (no thread per connection):
//
//   POST /v1/completions, POST /v1/chat/completions   JSON, or server-sent events with "stream"
//   GET  /v1/models, GET /health, GET /metrics
//
// Errors come back as {"error": {"message", "type", "code"}} with the HTTP status of the gRPC code
// (400 bad input, 404 unknown model or path, 405 wrong method, 429 over capacity, 503 no worker).
// A body over the limit gets libevent's own 413 page (libevent 2.1 has no hook for its errors).
// A client that disconnects cancels its request, streamed or not.
//
// Drainable (common/serve.h), beside the RequestRouter's drain, which refuses new requests and
// counts those in flight: once draining, GET /health answers 503 {"status": "draining", ...} (a
// readiness probe takes the router out of rotation), a new request gets 503 "router is
// draining" with Retry-After, and every reply asks the client to close its connection; a request
// in flight is finished when its reply has been written out to the client.
#ifndef TANDEM_ROUTER_SERVER_HTTP_SERVER_H_
#define TANDEM_ROUTER_SERVER_HTTP_SERVER_H_

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "common/serve.h"
#include "router/auth/tenant_gate.h"
#include "router/server/request_router.h"

namespace tandem::router {

class HttpServer final : public Drainable {
 public:
  struct Options {
    std::string listen = "0.0.0.0:8000";  // port 0: any
    int64_t max_body_bytes = 8 << 20;
    // API keys and tenant limits (router/auth): every path but the gate's open ones needs a key
    // (401 without, 429 over a tenant's limit). Not owned; outlives the server. Null: no keys.
    auth::ApiKeyGate* api_keys = nullptr;
  };
  // UNAVAILABLE when the address cannot be bound; INVALID_ARGUMENT when it is malformed.
  static absl::StatusOr<std::unique_ptr<HttpServer>> Start(RequestRouter* router,
                                                           const Options& options);
  // Cancels the requests still open, waits up to 5 s for their replies to be written, and stops
  // the loop.
  ~HttpServer() override;

  int port() const;

  // Drainable. The work is every generation request, from its arrival until its reply was
  // written out or its client went away.
  void StartDrain() override;
  bool AwaitIdle(absl::Time deadline) override;
  // Says how many requests are still open. Their relays are the RequestRouter's, which its own
  // HandOff cuts; their error events are written before the destructor stops the loop.
  void HandOff() override;

  struct Impl;

 private:
  explicit HttpServer(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace tandem::router

#endif  // TANDEM_ROUTER_SERVER_HTTP_SERVER_H_
