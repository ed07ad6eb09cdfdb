#include "common/keepalive.h"

#include <algorithm>
#include <climits>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"

namespace tandem {
namespace {

constexpr absl::Duration kShortest = absl::Milliseconds(100);

int Millis(absl::Duration d) {
  return static_cast<int>(std::min<int64_t>(absl::ToInt64Milliseconds(d), INT_MAX));
}

}  // namespace

absl::Status ValidateKeepalive(const KeepaliveOptions& options) {
  if (options.time < kShortest) {
    return absl::InvalidArgumentError(
        absl::StrCat("keepalive time must be at least 100 ms, got ", absl::FormatDuration(options.time)));
  }
  if (options.timeout < kShortest) {
    return absl::InvalidArgumentError(absl::StrCat("keepalive timeout must be at least 100 ms, got ",
                                                   absl::FormatDuration(options.timeout)));
  }
  return absl::OkStatus();
}

grpc::ChannelArguments ChannelArgumentsFor(const KeepaliveOptions& options) {
  grpc::ChannelArguments args;
  args.SetInt(GRPC_ARG_KEEPALIVE_TIME_MS, Millis(options.time));
  args.SetInt(GRPC_ARG_KEEPALIVE_TIMEOUT_MS, Millis(options.timeout));
  args.SetInt(GRPC_ARG_KEEPALIVE_PERMIT_WITHOUT_CALLS, options.permit_without_calls ? 1 : 0);
  // A client that only receives (a server stream) sends no data: keep pinging all the same.
  args.SetInt(GRPC_ARG_HTTP2_MAX_PINGS_WITHOUT_DATA, 0);
  // After a lost connection, try again soon: the link may be back within seconds.
  args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, Millis(std::min(options.time, absl::Seconds(1))));
  args.SetInt(GRPC_ARG_MIN_RECONNECT_BACKOFF_MS, Millis(std::min(options.time, absl::Seconds(1))));
  args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, Millis(options.time));
  return args;
}

std::shared_ptr<grpc::Channel> CreateKeepaliveChannel(const std::string& address,
                                                      const KeepaliveOptions& options,
                                                      const ChannelSecurity& security) {
  grpc::ChannelArguments args = ChannelArgumentsFor(options);
  std::shared_ptr<grpc::ChannelCredentials> credentials = ApplyChannelSecurity(security, &args);
  return grpc::CreateCustomChannel(address, credentials, args);
}

void ApplyKeepalive(const KeepaliveOptions& options, grpc::ServerBuilder* builder) {
  builder->AddChannelArgument(GRPC_ARG_KEEPALIVE_TIME_MS, Millis(options.time));
  builder->AddChannelArgument(GRPC_ARG_KEEPALIVE_TIMEOUT_MS, Millis(options.timeout));
  builder->AddChannelArgument(GRPC_ARG_KEEPALIVE_PERMIT_WITHOUT_CALLS,
                              options.permit_without_calls ? 1 : 0);
  builder->AddChannelArgument(GRPC_ARG_HTTP2_MAX_PINGS_WITHOUT_DATA, 0);
  // Clients of the cluster ping every `time`, with or without data: not a misbehaving client.
  builder->AddChannelArgument(GRPC_ARG_HTTP2_MIN_RECV_PING_INTERVAL_WITHOUT_DATA_MS,
                              Millis(options.time) / 2);
  builder->AddChannelArgument(GRPC_ARG_HTTP2_MAX_PING_STRIKES, 0);
}

bool IsKeepaliveFailure(absl::string_view message) {
  return absl::StrContains(absl::AsciiStrToLower(message), "keepalive");
}

}  // namespace tandem
