// HTTPS for the router's OpenAI HTTP server (libevent's evhttp): every connection it accepts is
// wrapped in TLS (libevent's OpenSSL bufferevent) with the current context of a
// ServerTlsContext, so a certificate replaced on disk is used for the connections accepted after
// the reload. A client that does not speak TLS gets its connection closed.
#ifndef TANDEM_ROUTER_SERVER_HTTPS_LISTENER_H_
#define TANDEM_ROUTER_SERVER_HTTPS_LISTENER_H_

#include <event2/http.h>

#include "common/server_tls_context.h"

namespace tandem::router {

// Makes `http` accept TLS only. Call before it binds. REQUIRES: `tls` outlives `http`.
void ServeHttps(evhttp* http, ServerTlsContext* tls);

}  // namespace tandem::router

#endif  // TANDEM_ROUTER_SERVER_HTTPS_LISTENER_H_
