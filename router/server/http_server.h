// The router's OpenAI-compatible HTTP API, on one libevent loop (no thread per connection):
//
//   POST /v1/completions, POST /v1/chat/completions   JSON, or server-sent events with "stream"
//   GET  /v1/models, GET /health, GET /metrics
//
// Errors come back as {"error": {"message", "type", "code"}} with the HTTP status of the gRPC code
// (400 bad input, 404 unknown model or path, 405 wrong method, 429 over capacity, 503 no worker).
// A body over the limit gets libevent's own 413 page (libevent 2.1 has no hook for its errors).
// A client that disconnects cancels its request, streamed or not.
#ifndef TANDEM_ROUTER_SERVER_HTTP_SERVER_H_
#define TANDEM_ROUTER_SERVER_HTTP_SERVER_H_

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "router/server/request_router.h"

namespace tandem::router {

class HttpServer {
 public:
  struct Options {
    std::string listen = "0.0.0.0:8000";  // port 0: any
    int64_t max_body_bytes = 8 << 20;
  };
  // UNAVAILABLE when the address cannot be bound; INVALID_ARGUMENT when it is malformed.
  static absl::StatusOr<std::unique_ptr<HttpServer>> Start(RequestRouter* router,
                                                           const Options& options);
  ~HttpServer();  // stops the loop; open requests are cancelled

  int port() const;

  struct Impl;

 private:
  explicit HttpServer(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace tandem::router

#endif  // TANDEM_ROUTER_SERVER_HTTP_SERVER_H_
