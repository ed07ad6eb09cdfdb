// What tandem-prefill and tandem-decode do alike in main(): read the worker flags, create the
// UCX transport, start the engine with its KV pool in memory the transport allocated, start
// /metrics, register the pool, then serve their services until SIGINT / SIGTERM, and drain the
// services that are Drainable (common/serve.h) before exiting. Compiled into
// those two binaries only (worker_process.cc; libraries never read flags).
#ifndef TANDEM_WORKER_WORKER_PROCESS_H_
#define TANDEM_WORKER_WORKER_PROCESS_H_

#include <functional>
#include <memory>
#include <vector>

#include "worker/engine_loop.h"
#include "common/keepalive.h"
#include "common/tls.h"
#include "kvtransfer/kv_transport.h"
#include "grpcpp/grpcpp.h"
#include "grpcpp/impl/service_type.h"
#include "tandem/v1/worker.pb.h"

namespace tandem {

struct WorkerFlags {
  std::string listen;          // host:port of the gRPC server; port 0 picks one
  std::string metrics_listen;  // host:port of /metrics; empty: none
  bool metrics_tls = false;    // /metrics over HTTPS with tls's certificate and key
  std::string model_path;      // resolved
  std::string worker_id;       // never empty
  std::string ucx_tls;         // UCX transports; empty: UCX_TLS or UCX's choice
  // Keepalive of the gRPC server and of the worker's own channels (a decode worker's to the
  // prefill workers).
  KeepaliveOptions keepalive;
  // Of the gRPC server (mutual TLS with --tls_ca) and the worker's own channels (common/tls.h).
  TlsOptions tls;
  // After SIGTERM / SIGINT: how long the work in progress may run before it is handed off
  // (common/serve.h).
  absl::Duration drain_timeout = absl::Seconds(20);
  EngineLoop::Options loop;
};

// Reads the worker flags (after ParseFlagsWithEnvironment). INVALID_ARGUMENT / NOT_FOUND for bad
// values or a missing model.
absl::StatusOr<WorkerFlags> WorkerFlagsFromCommandLine();

struct WorkerProcess {
  WorkerFlags flags;
  std::unique_ptr<kvtransfer::KvTransport> transport;  // outlives the loop (its pool's memory)
  std::unique_ptr<EngineLoop> loop;
  v1::KvPoolDescriptor pool;  // the registered pool, for peers
  ChannelSecurity channel_security;  // of the worker's own channels (flags.tls)
  std::shared_ptr<grpc::ServerCredentials> server_credentials;  // of its gRPC server (flags.tls)
};

// `role` names the binary in its messages; `make_services` builds the services over the started
// worker. Returns main()'s exit status.
int RunWorkerProcess(
    int argc, char** argv, const char* role, const char* usage,
    const std::function<std::vector<std::unique_ptr<grpc::Service>>(WorkerProcess&)>& make_services);

}  // namespace tandem

#endif  // TANDEM_WORKER_WORKER_PROCESS_H_
