// tandem-prefill: a prefill worker. Serves tandem.v1.Prefill (compute a prompt, write its K/V
// layer by layer into a decode worker's blocks over the KV transport) and tandem.v1.WorkerState,
// with gRPC health and reflection, and /metrics.
//
//   tandem-prefill --listen=0.0.0.0:7200 --metrics_listen=0.0.0.0:9200 [--model=PATH]
#include "worker/worker_process.h"
#include "worker/worker_state_service.h"
#include "prefill_worker/prefill_service.h"

int main(int argc, char** argv) {
  using namespace tandem;  // NOLINT: main only
  return RunWorkerProcess(
      argc, argv, "tandem-prefill",
      "tandem-prefill: a prefill worker.\nusage: tandem-prefill --listen=HOST:PORT [--model=PATH]",
      [](WorkerProcess& w) {
        std::vector<std::unique_ptr<grpc::Service>> services;
        services.push_back(std::make_unique<PrefillService>(
            w.loop.get(), w.transport.get(), PrefillService::Options{.worker_id = w.flags.worker_id}));
        // A prefill-only worker's pool is not written by peers: no descriptor in its snapshot.
        services.push_back(std::make_unique<WorkerStateService>(
            w.loop.get(), WorkerStateService::Info{.worker_id = w.flags.worker_id,
                                                   .role = v1::ROLE_PREFILL,
                                                   .engine = "cpu",
                                                   .kv_pool = {}}));
        return services;
      });
}
