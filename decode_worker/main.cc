// tandem-decode: a decode worker. Serves tandem.v1.Decode (generation with continuous batching,
// prefill by the router's prefill workers over the KV transport or locally) and
// tandem.v1.WorkerState, with gRPC health and reflection, and /metrics.
//
//   tandem-decode --listen=0.0.0.0:7100 --metrics_listen=0.0.0.0:9100 [--model=PATH]
#include <cstdio>

#include "absl/strings/str_cat.h"
#include "common/flags.h"
#include "common/logging.h"
#include "common/metrics.h"
#include "decode_worker/decode_service.h"
#include "engine/serving/worker_main.h"
#include "engine/serving/worker_state_service.h"
#include "kvtransfer/ucx_transport.h"
#include "tandem/v1/worker.pb.h"

namespace tandem {
namespace {

absl::Status Run() {
  absl::StatusOr<WorkerFlags> flags = WorkerFlagsFromCommandLine();
  if (!flags.ok()) return flags.status();
  absl::StatusOr<std::unique_ptr<kvtransfer::KvTransport>> transport = kvtransfer::CreateUcxTransport(
      {.name = flags->worker_id, .transports = flags->ucx_tls});
  if (!transport.ok()) return transport.status();
  // The pool lives in memory the transport exposes best (shared memory for UCX on one host).
  flags->loop.engine.kv_allocator = (*transport)->PoolAllocator();
  absl::StatusOr<std::unique_ptr<EngineLoop>> loop =
      EngineLoop::Start(flags->model_path, flags->loop);
  if (!loop.ok()) return loop.status();
  if (!flags->metrics_listen.empty()) {
    absl::StatusOr<int> port = StartProcessMetricsServer(flags->metrics_listen);
    if (!port.ok()) return port.status();
  }
  absl::StatusOr<kvtransfer::PoolDescriptor> pool =
      (*transport)->RegisterPool(&(*loop)->kv_storage());
  if (!pool.ok()) return pool.status();
  v1::KvPoolDescriptor pool_proto;
  kvtransfer::ToProto(*pool, &pool_proto);

  DecodeService decode(loop->get(), {.worker_id = flags->worker_id, .kv_pool = pool_proto});
  WorkerStateService state(loop->get(), {.worker_id = flags->worker_id,
                                         .role = v1::ROLE_DECODE,
                                         .engine = "cpu",
                                         .kv_pool = pool_proto});
  return ServeUntilSignal(flags->listen, {&decode, &state}, [&](int port) {
    std::printf("tandem-decode %s listening on port %d (model %s, metrics port %d)\n",
                flags->worker_id.c_str(), port, (*loop)->model_id().c_str(), ProcessMetricsPort());
    std::fflush(stdout);
  });
}

}  // namespace
}  // namespace tandem

int main(int argc, char** argv) {
  tandem::BlockTerminationSignals();
  tandem::ParseFlagsWithEnvironment(
      argc, argv,
      "tandem-decode: a decode worker.\nusage: tandem-decode --listen=HOST:PORT [--model=PATH]");
  if (absl::Status s = tandem::Run(); !s.ok()) {
    std::fprintf(stderr, "tandem-decode: %s\n", s.ToString().c_str());
    return 1;
  }
  return 0;
}
