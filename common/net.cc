#include "common/net.h"

#include <fcntl.h>
#include <netdb.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <memory>

#include "absl/algorithm/container.h"
#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "common/status_macros.h"

namespace tandem {
namespace {

constexpr size_t kMaxResponseBytes = size_t{64} << 20;

// Owns a file descriptor.
class Fd {
 public:
  explicit Fd(int fd) : fd_(fd) {}
  Fd(const Fd&) = delete;
  Fd& operator=(const Fd&) = delete;
  ~Fd() {
    if (fd_ >= 0) ::close(fd_);
  }
  int get() const { return fd_; }

 private:
  int fd_;
};

int RemainingMillis(absl::Time deadline) {
  const absl::Duration left = deadline - absl::Now();
  if (left <= absl::ZeroDuration()) return 0;
  return static_cast<int>(std::min<int64_t>(absl::ToInt64Milliseconds(left) + 1, 1 << 30));
}

// Waits for `events` on `fd` until `deadline`.
absl::Status WaitFor(int fd, short events, absl::Time deadline, absl::string_view what) {
  while (true) {
    pollfd p{fd, events, 0};
    const int ms = RemainingMillis(deadline);
    if (ms == 0) return absl::DeadlineExceededError(absl::StrCat("timed out ", what));
    const int n = ::poll(&p, 1, ms);
    if (n > 0) return absl::OkStatus();
    if (n < 0 && errno != EINTR) {
      return absl::UnavailableError(absl::StrCat("poll failed ", what, ": ", std::strerror(errno)));
    }
  }
}

absl::StatusOr<std::unique_ptr<Fd>> Connect(const HostPort& address, absl::Time deadline) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* results = nullptr;
  const std::string port = std::to_string(address.port);
  if (int rc = ::getaddrinfo(address.host.c_str(), port.c_str(), &hints, &results); rc != 0) {
    return absl::UnavailableError(
        absl::StrCat("cannot resolve ", address.ToString(), ": ", ::gai_strerror(rc)));
  }
  std::unique_ptr<addrinfo, decltype(&::freeaddrinfo)> owned(results, &::freeaddrinfo);
  std::string last_error = "no addresses";
  for (addrinfo* ai = results; ai != nullptr; ai = ai->ai_next) {
    auto fd = std::make_unique<Fd>(
        ::socket(ai->ai_family, ai->ai_socktype | SOCK_NONBLOCK | SOCK_CLOEXEC, ai->ai_protocol));
    if (fd->get() < 0) {
      last_error = std::strerror(errno);
      continue;
    }
    if (::connect(fd->get(), ai->ai_addr, ai->ai_addrlen) == 0) return fd;
    if (errno != EINPROGRESS) {
      last_error = std::strerror(errno);
      continue;
    }
    RETURN_IF_ERROR(WaitFor(fd->get(), POLLOUT, deadline,
                            absl::StrCat("connecting to ", address.ToString())));
    int error = 0;
    socklen_t len = sizeof(error);
    ::getsockopt(fd->get(), SOL_SOCKET, SO_ERROR, &error, &len);
    if (error == 0) return fd;
    last_error = std::strerror(error);
  }
  return absl::UnavailableError(
      absl::StrCat("cannot connect to ", address.ToString(), ": ", last_error));
}

absl::Status SendAll(int fd, absl::string_view data, absl::Time deadline) {
  while (!data.empty()) {
    const ssize_t n = ::send(fd, data.data(), data.size(), MSG_NOSIGNAL);
    if (n > 0) {
      data.remove_prefix(static_cast<size_t>(n));
    } else if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
      RETURN_IF_ERROR(WaitFor(fd, POLLOUT, deadline, "sending the request"));
    } else if (n < 0 && errno != EINTR) {
      return absl::UnavailableError(absl::StrCat("send failed: ", std::strerror(errno)));
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<std::string> ReadUntilClosed(int fd, absl::Time deadline) {
  std::string data;
  char buffer[16384];
  while (true) {
    const ssize_t n = ::recv(fd, buffer, sizeof(buffer), 0);
    if (n > 0) {
      data.append(buffer, static_cast<size_t>(n));
      if (data.size() > kMaxResponseBytes) {
        return absl::DataLossError("HTTP response larger than 64 MiB");
      }
    } else if (n == 0) {
      return data;
    } else if (errno == EAGAIN || errno == EWOULDBLOCK) {
      RETURN_IF_ERROR(WaitFor(fd, POLLIN, deadline, "reading the response"));
    } else if (errno != EINTR) {
      return absl::UnavailableError(absl::StrCat("recv failed: ", std::strerror(errno)));
    }
  }
}

absl::StatusOr<std::string> Dechunk(absl::string_view body) {
  std::string out;
  while (true) {
    const size_t eol = body.find("\r\n");
    if (eol == absl::string_view::npos) return absl::DataLossError("truncated chunk size line");
    absl::string_view size_text = body.substr(0, eol);
    size_text = size_text.substr(0, size_text.find(';'));  // chunk extensions
    uint64_t size = 0;
    if (!absl::SimpleHexAtoi(absl::StripAsciiWhitespace(size_text), &size)) {
      return absl::DataLossError(absl::StrCat("bad chunk size '", size_text, "'"));
    }
    body.remove_prefix(eol + 2);
    if (size == 0) return out;
    if (body.size() < size + 2) return absl::DataLossError("truncated chunk");
    out.append(body.data(), size);
    body.remove_prefix(size + 2);
  }
}

absl::StatusOr<HttpResponse> ParseResponse(absl::string_view raw) {
  const size_t head_end = raw.find("\r\n\r\n");
  if (head_end == absl::string_view::npos) return absl::DataLossError("HTTP response has no header end");
  std::vector<absl::string_view> lines = absl::StrSplit(raw.substr(0, head_end), "\r\n");
  HttpResponse response;
  std::vector<absl::string_view> status_parts = absl::StrSplit(lines[0], absl::MaxSplits(' ', 2));
  if (status_parts.size() < 2 || !absl::StartsWith(status_parts[0], "HTTP/1.") ||
      !absl::SimpleAtoi(status_parts[1], &response.status) || response.status < 100 ||
      response.status > 999) {
    return absl::DataLossError(absl::StrCat("bad HTTP status line '", lines[0], "'"));
  }
  for (size_t i = 1; i < lines.size(); ++i) {
    const size_t colon = lines[i].find(':');
    if (colon == absl::string_view::npos) {
      return absl::DataLossError(absl::StrCat("bad HTTP header line '", lines[i], "'"));
    }
    response.headers.emplace_back(std::string(absl::StripAsciiWhitespace(lines[i].substr(0, colon))),
                                  std::string(absl::StripAsciiWhitespace(lines[i].substr(colon + 1))));
  }
  absl::string_view body = raw.substr(head_end + 4);
  const auto encoding = response.Header("Transfer-Encoding");
  if (encoding && absl::EqualsIgnoreCase(*encoding, "chunked")) {
    ASSIGN_OR_RETURN(response.body, Dechunk(body));
  } else if (const auto length = response.Header("Content-Length")) {
    size_t n = 0;
    if (!absl::SimpleAtoi(*length, &n) || n > body.size()) {
      return absl::DataLossError(absl::StrCat("body shorter than Content-Length ", *length));
    }
    response.body = std::string(body.substr(0, n));
  } else {
    response.body = std::string(body);
  }
  return response;
}

}  // namespace

std::string HostPort::ToString() const {
  if (absl::StrContains(host, ':')) return absl::StrCat("[", host, "]:", port);
  return absl::StrCat(host, ":", port);
}

absl::StatusOr<HostPort> ParseHostPort(absl::string_view text) {
  auto invalid = [&](absl::string_view why) {
    return absl::InvalidArgumentError(absl::StrCat("bad address '", text, "': ", why,
                                                   " (expected host:port or [ipv6]:port)"));
  };
  HostPort out;
  absl::string_view port_text;
  if (absl::StartsWith(text, "[")) {
    const size_t close = text.find(']');
    if (close == absl::string_view::npos) return invalid("unbalanced '['");
    out.host = std::string(text.substr(1, close - 1));
    if (out.host.empty()) return invalid("empty host");
    if (close + 1 >= text.size() || text[close + 1] != ':') return invalid("missing port");
    port_text = text.substr(close + 2);
  } else {
    const size_t colon = text.rfind(':');
    if (colon == absl::string_view::npos) return invalid("missing port");
    out.host = std::string(text.substr(0, colon));
    if (absl::StrContains(out.host, ':')) return invalid("IPv6 addresses need brackets");
    if (absl::StrContains(out.host, ']')) return invalid("unbalanced ']'");
    if (out.host.empty()) out.host = "0.0.0.0";
    port_text = text.substr(colon + 1);
  }
  if (port_text.empty() || !absl::c_all_of(port_text, absl::ascii_isdigit) ||
      port_text.size() > 5 || !absl::SimpleAtoi(port_text, &out.port) || out.port > 65535) {
    return invalid(absl::StrCat("port '", port_text, "' is not a number in 0..65535"));
  }
  return out;
}

std::optional<std::string> HttpResponse::Header(absl::string_view name) const {
  for (const auto& [key, value] : headers) {
    if (absl::EqualsIgnoreCase(key, name)) return value;
  }
  return std::nullopt;
}

absl::StatusOr<HttpResponse> HttpGet(const HostPort& address, absl::string_view path,
                                     absl::Duration timeout) {
  const absl::Time deadline = absl::Now() + timeout;
  ASSIGN_OR_RETURN(std::unique_ptr<Fd> fd, Connect(address, deadline));
  const std::string request = absl::StrCat("GET ", path, " HTTP/1.1\r\nHost: ", address.ToString(),
                                           "\r\nUser-Agent: tandem\r\nAccept: */*\r\n"
                                           "Connection: close\r\n\r\n");
  RETURN_IF_ERROR(SendAll(fd->get(), request, deadline));
  ASSIGN_OR_RETURN(std::string raw, ReadUntilClosed(fd->get(), deadline));
  return ParseResponse(raw);
}

}  // namespace tandem
