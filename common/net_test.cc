#include "common/net.h"

#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <string>
#include <thread>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace tandem {
namespace {

using ::testing::HasSubstr;

TEST(ParseHostPortTest, Valid) {
  struct Case {
    std::string text;
    HostPort want;
    std::string round_trip;
  };
  for (const Case& c : {Case{"localhost:8000", {"localhost", 8000}, "localhost:8000"},
                        Case{"127.0.0.1:0", {"127.0.0.1", 0}, "127.0.0.1:0"},
                        Case{"[::1]:65535", {"::1", 65535}, "[::1]:65535"},
                        Case{":9090", {"0.0.0.0", 9090}, "0.0.0.0:9090"},
                        Case{"decode-0.decode.ns.svc:50051",
                             {"decode-0.decode.ns.svc", 50051},
                             "decode-0.decode.ns.svc:50051"}}) {
    const auto got = ParseHostPort(c.text);
    ASSERT_TRUE(got.ok()) << c.text << ": " << got.status();
    EXPECT_EQ(*got, c.want) << c.text;
    EXPECT_EQ(got->ToString(), c.round_trip);
  }
}

TEST(ParseHostPortTest, InvalidNamesTheText) {
  for (const char* text : {"", "localhost", "localhost:", "host:http", "host:-1", "host:65536",
                           "host:123456", "::1:80", "[::1]80", "[::1", "[]:80", "host]:80",
                           "host: 80"}) {
    const auto got = ParseHostPort(text);
    EXPECT_EQ(got.status().code(), absl::StatusCode::kInvalidArgument) << "'" << text << "'";
    EXPECT_THAT(std::string(got.status().message()), HasSubstr(std::string("'") + text + "'"));
  }
}

// A one-shot TCP server on 127.0.0.1 that answers the first connection with `reply` (after
// reading the request head) and closes it. With `hold_open`, it never answers or closes.
class OneShotServer {
 public:
  explicit OneShotServer(std::string reply, bool hold_open = false) : reply_(std::move(reply)) {
    listener_ = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    addr.sin_port = 0;
    EXPECT_EQ(::bind(listener_, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
    EXPECT_EQ(::listen(listener_, 4), 0);
    socklen_t len = sizeof(addr);
    ::getsockname(listener_, reinterpret_cast<sockaddr*>(&addr), &len);
    port_ = ntohs(addr.sin_port);
    thread_ = std::thread([this, hold_open] {
      const int conn = ::accept(listener_, nullptr, nullptr);
      if (conn < 0) return;
      std::string head;
      char c;
      while (head.find("\r\n\r\n") == std::string::npos && ::recv(conn, &c, 1, 0) == 1) head += c;
      request_ = head;
      if (hold_open) {
        while (::recv(conn, &c, 1, 0) > 0) {
        }
      } else {
        ::send(conn, reply_.data(), reply_.size(), MSG_NOSIGNAL);
      }
      ::close(conn);
    });
  }
  ~OneShotServer() {
    ::shutdown(listener_, SHUT_RDWR);
    thread_.join();
    ::close(listener_);
  }
  HostPort address() const { return {"127.0.0.1", port_}; }
  const std::string& request() const { return request_; }

 private:
  std::string reply_;
  int listener_ = -1;
  int port_ = 0;
  std::string request_;
  std::thread thread_;
};

TEST(HttpGetTest, ContentLengthBody) {
  std::string request;
  {
    OneShotServer server(
        "HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: 5\r\n\r\nhello");
    const auto got = HttpGet(server.address(), "/metrics", absl::Seconds(10));
    ASSERT_TRUE(got.ok()) << got.status();
    EXPECT_EQ(got->status, 200);
    EXPECT_EQ(got->body, "hello");
    EXPECT_EQ(got->Header("content-type"), "text/plain");
    EXPECT_EQ(got->Header("X-Missing"), std::nullopt);
    request = server.request();
  }
  EXPECT_THAT(request, HasSubstr("GET /metrics HTTP/1.1\r\n"));
  EXPECT_THAT(request, HasSubstr("Host: 127.0.0.1:"));
}

TEST(HttpGetTest, ChunkedBody) {
  OneShotServer server(
      "HTTP/1.1 404 Not Found\r\nTransfer-Encoding: chunked\r\n\r\n"
      "4\r\nnot \r\n6;ext=1\r\nfound!\r\n0\r\n\r\n");
  const auto got = HttpGet(server.address(), "/x", absl::Seconds(10));
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(got->status, 404);
  EXPECT_EQ(got->body, "not found!");
}

TEST(HttpGetTest, MalformedResponsesAreDataLoss) {
  for (const char* reply : {"garbage\r\n\r\n", "HTTP/1.1 200 OK\r\nno-colon\r\n\r\n",
                            "HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\nshort",
                            "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n",
                            "HTTP/1.1 200 OK\r\n"}) {
    OneShotServer server(reply);
    const auto got = HttpGet(server.address(), "/", absl::Seconds(10));
    EXPECT_EQ(got.status().code(), absl::StatusCode::kDataLoss) << reply;
  }
}

TEST(HttpGetTest, SilentServerTimesOut) {
  OneShotServer server("", /*hold_open=*/true);
  const absl::Time start = absl::Now();
  const auto got = HttpGet(server.address(), "/", absl::Milliseconds(200));
  EXPECT_EQ(got.status().code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_LT(absl::Now() - start, absl::Seconds(5));
  // Unblock the server thread: connect once more is not needed; closing our side ends its loop.
}

TEST(HttpGetTest, NothingListeningIsUnavailable) {
  // Bind a port and close it again so that nothing listens there.
  int port;
  {
    OneShotServer server("HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n");
    port = server.address().port;
    ASSERT_TRUE(HttpGet(server.address(), "/", absl::Seconds(10)).ok());
  }
  const auto got = HttpGet({"127.0.0.1", port}, "/", absl::Seconds(10));
  EXPECT_EQ(got.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(std::string(got.status().message()), HasSubstr("127.0.0.1"));
}

}  // namespace
}  // namespace tandem
