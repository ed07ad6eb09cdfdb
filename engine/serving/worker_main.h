// What tandem-prefill and tandem-decode share in main(): their flags (worker_process.cc, linked into
// the two binaries only) and serving until SIGINT / SIGTERM.
#ifndef TANDEM_ENGINE_SERVING_WORKER_MAIN_H_
#define TANDEM_ENGINE_SERVING_WORKER_MAIN_H_

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/keepalive.h"
#include "engine/serving/engine_loop.h"
#include "grpcpp/grpcpp.h"

namespace tandem {

struct WorkerFlags {
  std::string listen;          // host:port of the gRPC server; port 0 picks one
  std::string metrics_listen;  // host:port of /metrics; empty: none
  std::string model_path;      // resolved
  std::string worker_id;       // never empty
  std::string ucx_tls;         // UCX transports; empty: UCX_TLS or UCX's choice
  // Keepalive of the gRPC server and of the worker's own channels (a decode worker's to the
  // prefill workers).
  KeepaliveOptions keepalive;
  EngineLoop::Options loop;
};

// Reads the worker flags (after ParseFlagsWithEnvironment). INVALID_ARGUMENT / NOT_FOUND for bad
// values or a missing model.
absl::StatusOr<WorkerFlags> WorkerFlagsFromCommandLine();

// Builds a gRPC server on `listen` with `services`, the standard health service (serving),
// reflection and `keepalive` (common/keepalive.h: it finds a client that stopped answering); calls `on_ready` with the bound port; blocks until SIGINT or SIGTERM, then shuts
// the server down (cancelling open calls, waiting up to `grace`). Call before starting threads
// that should not receive the signals (it blocks them in the calling thread and its children).
absl::Status ServeUntilSignal(const std::string& listen, const std::vector<grpc::Service*>& services,
                              const std::function<void(int port)>& on_ready,
                              const KeepaliveOptions& keepalive = {},
                              absl::Duration grace = absl::Seconds(5));

// Blocks SIGINT and SIGTERM in this thread (and the threads it starts afterwards), so that
// ServeUntilSignal can wait for them. Call first thing in main().
void BlockTerminationSignals();

}  // namespace tandem

#endif  // TANDEM_ENGINE_SERVING_WORKER_MAIN_H_
