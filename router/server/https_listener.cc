#include "router/server/https_listener.h"

#include <event2/bufferevent.h>
#include <event2/bufferevent_ssl.h>

#include <cstdio>
#include <cstdlib>

namespace tandem::router {
namespace {

bufferevent* NewTlsConnection(event_base* base, void* arg) {
  SSL* ssl = static_cast<ServerTlsContext*>(arg)->NewSsl();
  // evhttp would serve the connection in plaintext if given no bufferevent: never that. SSL_new
  // fails only without memory.
  if (ssl == nullptr) {
    std::fprintf(stderr, "tandem-router: out of memory for a TLS connection\n");
    std::abort();
  }
  // evhttp gives the accepted socket to it (bufferevent_setfd) and frees it with the connection.
  bufferevent* bev = bufferevent_openssl_socket_new(base, -1, ssl, BUFFEREVENT_SSL_ACCEPTING,
                                                    BEV_OPT_CLOSE_ON_FREE);
  if (bev == nullptr) {
    std::fprintf(stderr, "tandem-router: out of memory for a TLS connection\n");
    std::abort();
  }
  // A client that closes its socket without TLS's close_notify (most do after a response they
  // read to its end) ends the connection, not an error.
  bufferevent_openssl_set_allow_dirty_shutdown(bev, 1);
  return bev;
}

}  // namespace

void ServeHttps(evhttp* http, ServerTlsContext* tls) {
  evhttp_set_bevcb(http, NewTlsConnection, tls);
}

}  // namespace tandem::router
