// What every server process does in main(): serve gRPC services until SIGINT / SIGTERM.
#ifndef TANDEM_COMMON_SERVE_H_
#define TANDEM_COMMON_SERVE_H_

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/keepalive.h"
#include "grpcpp/grpcpp.h"

namespace tandem {

// Builds a gRPC server on `listen` with `services`, the standard health service (serving),
// reflection and `keepalive` (common/keepalive.h: it finds a client that stopped answering);
// calls `on_ready` with the bound port; blocks until SIGINT or SIGTERM, then shuts the server
// down (cancelling open calls, waiting up to `grace`). Call before starting threads that should
// not receive the signals (it blocks them in the calling thread and its children).
absl::Status ServeUntilSignal(const std::string& listen, const std::vector<grpc::Service*>& services,
                              const std::function<void(int port)>& on_ready,
                              const KeepaliveOptions& keepalive = {},
                              absl::Duration grace = absl::Seconds(5));

// Blocks SIGINT and SIGTERM in this thread (and the threads it starts afterwards), so that
// ServeUntilSignal can wait for them. Call first thing in main().
void BlockTerminationSignals();

}  // namespace tandem

#endif  // TANDEM_COMMON_SERVE_H_
