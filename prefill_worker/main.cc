// tandem-prefill: a prefill worker. Serves tandem.v1.Prefill (compute a prompt, write its K/V
// layer by layer into a decode worker's blocks over the KV transport) and tandem.v1.WorkerState,
// with gRPC health and reflection, and /metrics.
//
//   tandem-prefill --listen=0.0.0.0:7200 --metrics_listen=0.0.0.0:9200 [--model=PATH]
#include <cstdio>

#include "common/flags.h"
#include "common/logging.h"
#include "common/metrics.h"
#include "engine/serving/worker_main.h"
#include "engine/serving/worker_state_service.h"
#include "kvtransfer/ucx_transport.h"
#include "prefill_worker/prefill_service.h"

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
  // The pool is the source of this worker's writes.
  if (absl::Status s = (*transport)->RegisterPool(&(*loop)->kv_storage()).status(); !s.ok()) {
    return s;
  }
  PrefillService prefill(loop->get(), transport->get(), {.worker_id = flags->worker_id});
  WorkerStateService state(loop->get(), {.worker_id = flags->worker_id,
                                         .role = v1::ROLE_PREFILL,
                                         .engine = "cpu",
                                         .kv_pool = {}});
  return ServeUntilSignal(flags->listen, {&prefill, &state}, [&](int port) {
    std::printf("tandem-prefill %s listening on port %d (model %s, metrics port %d)\n",
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
      "tandem-prefill: a prefill worker.\nusage: tandem-prefill --listen=HOST:PORT [--model=PATH]");
  if (absl::Status s = tandem::Run(); !s.ok()) {
    std::fprintf(stderr, "tandem-prefill: %s\n", s.ToString().c_str());
    return 1;
  }
  return 0;
}
