#include "common/https_terminator.h"

#include <arpa/inet.h>
#include <event2/buffer.h>
#include <event2/bufferevent.h>
#include <event2/bufferevent_ssl.h>
#include <event2/event.h>
#include <event2/listener.h>
#include <event2/thread.h>
#include <netdb.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <csignal>
#include <thread>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "common/logging.h"
#include "common/net.h"

namespace tandem {
namespace {

// How much one side may hold unsent before the other side stops being read (a client that
// uploads faster than the HTTP server reads, or reads slower than it writes).
constexpr size_t kMaxBuffered = 1 << 20;

struct Relay;

}  // namespace

struct HttpsTerminator::Impl {
  Options options;
  event_base* base = nullptr;
  evconnlistener* listener = nullptr;
  event* stop = nullptr;
  event* stop_deadline = nullptr;
  bool stopping = false;  // loop thread only
  std::thread thread;
  int port = 0;
  absl::flat_hash_set<Relay*> relays;  // touched on the loop thread only

  void Accept(evutil_socket_t fd);
  void Close(Relay* relay);
  void Stop();
};

namespace {

// One client connection: its TLS side and the plaintext connection to the HTTP server.
struct Relay {
  HttpsTerminator::Impl* owner = nullptr;
  evutil_socket_t fd = -1;  // the client's socket, closed with the relay
  SSL* ssl = nullptr;
  bufferevent* tls = nullptr;
  bufferevent* plain = nullptr;
  bool ended = false;  // one side ended: close once the other's pending bytes are out

  bufferevent* Other(bufferevent* bev) const { return bev == tls ? plain : tls; }
};

// Bytes that came in on one side go out on the other; reading pauses while the other side holds
// kMaxBuffered unsent.
void OnRead(bufferevent* bev, void* arg) {
  auto* relay = static_cast<Relay*>(arg);
  bufferevent* other = relay->Other(bev);
  evbuffer_add_buffer(bufferevent_get_output(other), bufferevent_get_input(bev));
  if (evbuffer_get_length(bufferevent_get_output(other)) >= kMaxBuffered) {
    bufferevent_disable(bev, EV_READ);
  }
}

void OnWritten(bufferevent* bev, void* arg) {
  auto* relay = static_cast<Relay*>(arg);
  if (relay->ended) {
    if (evbuffer_get_length(bufferevent_get_output(relay->tls)) == 0 &&
        evbuffer_get_length(bufferevent_get_output(relay->plain)) == 0) {
      relay->owner->Close(relay);
    }
    return;
  }
  // Drained below the low watermark (set to half the limit): read the other side again -- but
  // no new requests from the client once the terminator stops.
  bufferevent* other = relay->Other(bev);
  if (other == relay->tls && relay->owner->stopping) return;
  bufferevent_enable(other, EV_READ);
}

void OnEvent(bufferevent* bev, short what, void* arg) {
  auto* relay = static_cast<Relay*>(arg);
  if ((what & BEV_EVENT_CONNECTED) != 0) return;
  if ((what & (BEV_EVENT_EOF | BEV_EVENT_ERROR | BEV_EVENT_TIMEOUT)) == 0) return;
  // What this side still had to say goes to the other; then the other gets what is pending out
  // and the relay closes.
  bufferevent* other = relay->Other(bev);
  evbuffer_add_buffer(bufferevent_get_output(other), bufferevent_get_input(bev));
  relay->ended = true;
  bufferevent_disable(bev, EV_READ | EV_WRITE);
  bufferevent_disable(other, EV_READ);
  if (evbuffer_get_length(bufferevent_get_output(other)) == 0) {
    relay->owner->Close(relay);
  } else {
    bufferevent_enable(other, EV_WRITE);
  }
}

}  // namespace

void HttpsTerminator::Impl::Accept(evutil_socket_t fd) {
  SSL* ssl = options.tls->NewSsl();
  if (ssl == nullptr) {
    LOG(WARNING) << "HTTPS: no memory for a TLS connection; closing it";
    evutil_closesocket(fd);
    return;
  }
  auto* relay = new Relay{.owner = this, .fd = fd, .ssl = ssl};
  // Without BEV_OPT_CLOSE_ON_FREE: the relay frees the SSL and closes the socket itself, once.
  relay->tls = bufferevent_openssl_socket_new(base, fd, ssl, BUFFEREVENT_SSL_ACCEPTING, 0);
  relay->plain = bufferevent_socket_new(base, -1, BEV_OPT_CLOSE_ON_FREE);
  if (relay->tls == nullptr || relay->plain == nullptr) {
    LOG(WARNING) << "HTTPS: no memory for a connection; closing it";
    relays.insert(relay);
    Close(relay);
    return;
  }
  relays.insert(relay);
  // A client that closes its socket without TLS's close_notify (most do) ends the connection,
  // not an error.
  bufferevent_openssl_set_allow_dirty_shutdown(relay->tls, 1);
  for (bufferevent* bev : {relay->tls, relay->plain}) {
    bufferevent_setcb(bev, OnRead, OnWritten, OnEvent, relay);
    bufferevent_setwatermark(bev, EV_WRITE, kMaxBuffered / 2, 0);
    bufferevent_enable(bev, EV_READ | EV_WRITE);
  }
  sockaddr_in backend{};
  backend.sin_family = AF_INET;
  backend.sin_port = htons(static_cast<uint16_t>(options.backend_port));
  backend.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (bufferevent_socket_connect(relay->plain, reinterpret_cast<sockaddr*>(&backend),
                                 sizeof(backend)) != 0) {
    LOG(WARNING) << "HTTPS: cannot reach the HTTP server on port " << options.backend_port;
    Close(relay);
  }
}

void HttpsTerminator::Impl::Close(Relay* relay) {
  relays.erase(relay);
  if (relay->tls != nullptr) bufferevent_free(relay->tls);
  if (relay->plain != nullptr) bufferevent_free(relay->plain);
  SSL_free(relay->ssl);
  evutil_closesocket(relay->fd);
  delete relay;
  if (stopping && relays.empty()) event_base_loopexit(base, nullptr);
}

// No new connections and no new requests; each relay closes when the HTTP server (stopped
// first) closes its side and what that side sent is out, or at the deadline. Judging by the
// buffers alone would cut a reply's end still in the loopback socket.
void HttpsTerminator::Impl::Stop() {
  stopping = true;
  evconnlistener_disable(listener);
  if (relays.empty()) {
    event_base_loopexit(base, nullptr);
    return;
  }
  for (Relay* relay : relays) {
    if (relay->tls != nullptr) bufferevent_disable(relay->tls, EV_READ);
  }
  const timeval deadline{.tv_sec = 2, .tv_usec = 0};
  event_add(stop_deadline, &deadline);
}

absl::StatusOr<std::unique_ptr<HttpsTerminator>> HttpsTerminator::Start(const Options& options) {
  static const bool threads = [] { return evthread_use_pthreads() == 0; }();
  if (!threads) return absl::InternalError("libevent has no pthreads support");
  std::signal(SIGPIPE, SIG_IGN);  // a client that resets its connection gives EPIPE
  absl::StatusOr<HostPort> address = ParseHostPort(options.listen);
  if (!address.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("bad HTTPS address '", options.listen, "'"));
  }
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE | AI_NUMERICSERV;
  addrinfo* found = nullptr;
  const std::string host = address->host.empty() ? "0.0.0.0" : address->host;
  if (getaddrinfo(host.c_str(), std::to_string(address->port).c_str(), &hints, &found) != 0 ||
      found == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat("cannot resolve '", options.listen, "'"));
  }
  auto impl = std::make_unique<Impl>();
  impl->options = options;
  impl->base = event_base_new();
  Impl* raw = impl.get();
  impl->listener = evconnlistener_new_bind(
      impl->base,
      [](evconnlistener*, evutil_socket_t fd, sockaddr*, int, void* arg) {
        static_cast<Impl*>(arg)->Accept(fd);
      },
      raw, LEV_OPT_CLOSE_ON_FREE | LEV_OPT_REUSEABLE, -1, found->ai_addr,
      static_cast<int>(found->ai_addrlen));
  freeaddrinfo(found);
  if (impl->listener == nullptr) {
    event_base_free(impl->base);
    return absl::UnavailableError(absl::StrCat("cannot listen on ", options.listen));
  }
  sockaddr_storage bound{};
  socklen_t len = sizeof(bound);
  getsockname(evconnlistener_get_fd(impl->listener), reinterpret_cast<sockaddr*>(&bound), &len);
  impl->port = ntohs(bound.ss_family == AF_INET6
                         ? reinterpret_cast<sockaddr_in6*>(&bound)->sin6_port
                         : reinterpret_cast<sockaddr_in*>(&bound)->sin_port);
  // Stopping runs on the loop (Stop), which ends once every relay closed or at the deadline.
  impl->stop = event_new(
      impl->base, -1, 0, [](evutil_socket_t, short, void* arg) { static_cast<Impl*>(arg)->Stop(); },
      raw);
  impl->stop_deadline = evtimer_new(
      impl->base,
      [](evutil_socket_t, short, void* arg) {
        auto* i = static_cast<Impl*>(arg);
        while (!i->relays.empty()) i->Close(*i->relays.begin());
      },
      raw);
  impl->thread = std::thread([raw] { event_base_loop(raw->base, EVLOOP_NO_EXIT_ON_EMPTY); });
  return std::unique_ptr<HttpsTerminator>(new HttpsTerminator(std::move(impl)));
}

HttpsTerminator::HttpsTerminator(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

HttpsTerminator::~HttpsTerminator() {
  event_active(impl_->stop, 0, 0);
  impl_->thread.join();
  event_free(impl_->stop);
  event_free(impl_->stop_deadline);
  evconnlistener_free(impl_->listener);
  event_base_free(impl_->base);
}

int HttpsTerminator::port() const { return impl_->port; }

}  // namespace tandem
