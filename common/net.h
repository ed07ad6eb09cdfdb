// Small network helpers: parsing "host:port" addresses from configuration, and a minimal blocking
// HTTP/1.1 GET client for health checks, scrapes and tests. Servers live in their own modules.
#ifndef TANDEM_COMMON_NET_H_
#define TANDEM_COMMON_NET_H_

#include <optional>
#include <string>
#include "absl/strings/string_view.h"
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace tandem {

struct HostPort {
  std::string host;  // a name, an IPv4 address or an IPv6 address (without brackets)
  int port = 0;      // 0..65535; 0 asks the system for a free port when binding

  // "host:port", with brackets around an IPv6 address: "[::1]:8000".
  std::string ToString() const;
  friend bool operator==(const HostPort&, const HostPort&) = default;
};

// Parses "host:port", "[ipv6]:port" or ":port" (host "0.0.0.0"). Returns INVALID_ARGUMENT with
// the offending text for anything else (missing or non-numeric port, port over 65535, unbalanced
// brackets, an empty host inside brackets, a bare IPv6 address without brackets).
absl::StatusOr<HostPort> ParseHostPort(absl::string_view text);

struct HttpResponse {
  int status = 0;
  std::vector<std::pair<std::string, std::string>> headers;  // in order received
  std::string body;                                           // de-chunked

  // The first header named `name` (case-insensitive), if any.
  std::optional<std::string> Header(absl::string_view name) const;
};

// GETs http://<address><path> with `Connection: close` and waits for the whole response, at most
// `timeout` in all. Errors: UNAVAILABLE when the connection fails, DEADLINE_EXCEEDED on timeout,
// DATA_LOSS for a malformed or over-large (> 64 MiB) response.
absl::StatusOr<HttpResponse> HttpGet(const HostPort& address, absl::string_view path,
                                     absl::Duration timeout);

}  // namespace tandem

#endif  // TANDEM_COMMON_NET_H_
