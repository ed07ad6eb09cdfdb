// HTTPS in front of a plain HTTP server of this process (the router's OpenAI HTTP API, a worker's
// /metrics with --metrics_tls): a TLS terminator on the public address that decrypts each
// connection with the current context of a ServerTlsContext (so a certificate replaced on disk is
// used for the connections accepted after its reload) and relays the plaintext bytes, both ways,
// to the HTTP server listening on a loopback port. A client that does not speak TLS has its
// connection closed.
//
// Why a relay and not evhttp's own OpenSSL bufferevents (evhttp_set_bevcb): with those, libevent
// 2.1.12 lost the end of about one streamed reply in ten under load, and pieces of others (a
// write callback that fires after the output drained lets evhttp finish the request while later
// bytes still wait; tests/cluster/tls_test.py streams many replies at once to keep it fixed).
// The relay only moves bytes and never disables writing, and evhttp keeps plain sockets.
//
// The HTTP server's own port is plaintext on 127.0.0.1: processes on this host (in Kubernetes,
// this pod) can reach it without TLS.
//
// Thread-safe to construct and destroy; it runs on a thread of its own.
#ifndef TANDEM_COMMON_HTTPS_TERMINATOR_H_
#define TANDEM_COMMON_HTTPS_TERMINATOR_H_

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "common/server_tls_context.h"

namespace tandem {

class HttpsTerminator {
 public:
  struct Options {
    std::string listen;       // host:port of the HTTPS API (port 0: any)
    int backend_port = 0;     // the HTTP server's port on 127.0.0.1
    ServerTlsContext* tls = nullptr;  // not owned; outlives the terminator
  };
  // INVALID_ARGUMENT for a malformed address; UNAVAILABLE when it cannot be bound.
  static absl::StatusOr<std::unique_ptr<HttpsTerminator>> Start(const Options& options);
  // Stops accepting and reading requests; each connection closes once the HTTP server closed its
  // side and what that side sent is out (the end of a reply written just before), or after 2 s.
  // REQUIRES: the HTTP server was stopped first (so it closes its side).
  ~HttpsTerminator();

  int port() const;

  struct Impl;  // opaque: the event loop and its connections

 private:
  explicit HttpsTerminator(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace tandem

#endif  // TANDEM_COMMON_HTTPS_TERMINATOR_H_
