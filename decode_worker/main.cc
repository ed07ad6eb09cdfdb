// tandem-decode: a decode worker. Serves tandem.v1.Decode (generation with continuous batching,
// prefill by the router's prefill workers over the KV transport or locally) and
// tandem.v1.WorkerState, with gRPC health and reflection, and /metrics.
//
//   tandem-decode --listen=0.0.0.0:7100 --metrics_listen=0.0.0.0:9100 [--model=PATH]
#include "decode_worker/decode_service.h"
#include "engine/serving/worker_process.h"
#include "engine/serving/worker_state_service.h"

int main(int argc, char** argv) {
  using namespace tandem;  // NOLINT: main only
  return RunWorkerProcess(
      argc, argv, "tandem-decode",
      "tandem-decode: a decode worker.\nusage: tandem-decode --listen=HOST:PORT [--model=PATH]",
      [](WorkerProcess& w) {
        std::vector<std::unique_ptr<grpc::Service>> services;
        services.push_back(std::make_unique<DecodeService>(
            w.loop.get(), DecodeService::Options{.worker_id = w.flags.worker_id, .kv_pool = w.pool}));
        services.push_back(std::make_unique<WorkerStateService>(
            w.loop.get(), WorkerStateService::Info{.worker_id = w.flags.worker_id,
                                                   .role = v1::ROLE_DECODE,
                                                   .engine = "cpu",
                                                   .kv_pool = w.pool}));
        return services;
      });
}
