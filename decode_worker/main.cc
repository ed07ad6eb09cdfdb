// tandem-decode: a decode worker. Serves tandem.v1.Decode (generation with continuous batching,
// prefill by the router's prefill workers over the KV transport or locally) and
// tandem.v1.WorkerState, with gRPC health and reflection, and /metrics.
//
//   tandem-decode --listen=0.0.0.0:7100 --metrics_listen=0.0.0.0:9100 [--model=PATH]
#include <cstdio>
#include <cstdlib>

#include "absl/flags/flag.h"
#include "decode_worker/decode_service.h"
#include "worker/worker_process.h"
#include "worker/worker_state_service.h"

ABSL_FLAG(int64_t, stream_heartbeat_ms, 1000,
          "A stream with nothing to send for this long sends the router a heartbeat, so that the "
          "router tells a slow stream from a silent worker (its --stream_stall_timeout_ms), ms");

int main(int argc, char** argv) {
  using namespace tandem;  // NOLINT: main only
  return RunWorkerProcess(
      argc, argv, "tandem-decode",
      "tandem-decode: a decode worker.\nusage: tandem-decode --listen=HOST:PORT [--model=PATH]",
      [](WorkerProcess& w) {
        if (absl::GetFlag(FLAGS_stream_heartbeat_ms) <= 0) {
          std::fprintf(stderr, "tandem-decode: --stream_heartbeat_ms must be positive\n");
          std::exit(2);
        }
        std::vector<std::unique_ptr<grpc::Service>> services;
        services.push_back(std::make_unique<DecodeService>(
            w.loop.get(),
            DecodeService::Options{.worker_id = w.flags.worker_id,
                                   .kv_pool = w.pool,
                                   .heartbeat = absl::Milliseconds(absl::GetFlag(FLAGS_stream_heartbeat_ms)),
                                   .keepalive = w.flags.keepalive,
                                   .security = w.channel_security}));
        services.push_back(std::make_unique<WorkerStateService>(
            w.loop.get(), WorkerStateService::Info{.worker_id = w.flags.worker_id,
                                                   .role = v1::ROLE_DECODE,
                                                   .engine = "cpu",
                                                   .kv_pool = w.pool}));
        return services;
      });
}
