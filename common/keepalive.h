// gRPC keepalive for every channel and server of the cluster, so that a peer that stops answering
// without closing its connections (a cut link, a host that froze) is found out within
// `time + timeout` instead of the kernel's TCP timeouts (minutes).
//
// Both ends of a connection ping: a client (the router's Decode.Generate and WatchState streams,
// a decode worker's Prefill calls) finds a dead server, a server finds a dead client and cancels
// its calls (the decode worker then frees the stream's blocks). A server accepts its clients'
// pings as often as every `time`, with or without calls and data; the HTTP/2 default would answer
// a client that pings more often than every 5 minutes without data with GOAWAY
// ("too_many_pings"), and a client by default stops pinging after two pings without data, which a
// server stream that only receives never sends.
//
//   grpc::ChannelArguments args = ChannelArgumentsFor(keepalive);
//   auto channel = grpc::CreateCustomChannel(address, ApplyChannelSecurity(security, &args), args);
//   ...
//   grpc::ServerBuilder builder;
//   ApplyKeepalive(keepalive, &builder);
#ifndef TANDEM_COMMON_KEEPALIVE_H_
#define TANDEM_COMMON_KEEPALIVE_H_

#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "common/tls.h"
#include "grpcpp/grpcpp.h"

namespace tandem {

struct KeepaliveOptions {
  // Idle time after which a ping goes out; also the shortest interval between the pings a
  // server accepts from a client. >= 100 ms.
  absl::Duration time = absl::Seconds(2);
  // How long a ping may wait for its answer before the connection is closed (its calls fail with
  // UNAVAILABLE). >= 100 ms.
  absl::Duration timeout = absl::Seconds(2);
  // Ping also while no call is open (a channel kept for the next call finds out early that its
  // peer is gone).
  bool permit_without_calls = true;
};

// INVALID_ARGUMENT naming the field for a time or timeout under 100 ms.
absl::Status ValidateKeepalive(const KeepaliveOptions& options);

// The channel arguments of a client with `options` (keepalive, and reconnect backoff capped at
// `time` so that a peer whose link returns is reached again within seconds).
// REQUIRES: ValidateKeepalive(options).ok().
grpc::ChannelArguments ChannelArgumentsFor(const KeepaliveOptions& options);

// A channel to `address` with `options`, plaintext or TLS as `security` says (common/tls.h).
std::shared_ptr<grpc::Channel> CreateKeepaliveChannel(const std::string& address,
                                                      const KeepaliveOptions& options,
                                                      const ChannelSecurity& security = {});

// Sets keepalive on a server, and lets its clients ping as often as every `options.time`.
// REQUIRES: ValidateKeepalive(options).ok().
void ApplyKeepalive(const KeepaliveOptions& options, grpc::ServerBuilder* builder);

// Whether a failed call's message says the connection was closed by a keepalive ping left
// unanswered (gRPC's "keepalive watchdog timeout"), for metrics.
bool IsKeepaliveFailure(absl::string_view message);

}  // namespace tandem

#endif  // TANDEM_COMMON_KEEPALIVE_H_
