// tandem.v1.WorkerState on a worker: a snapshot of its prefix cache and load, then its KV events as
// they happen and a load sample every interval (DESIGN.md §4). A subscriber that fell behind the
// kept event history gets a new snapshot.
#ifndef TANDEM_WORKER_WORKER_STATE_SERVICE_H_
#define TANDEM_WORKER_WORKER_STATE_SERVICE_H_

#include <string>

#include "worker/engine_loop.h"
#include "tandem/v1/worker.grpc.pb.h"

namespace tandem {

class WorkerStateService final : public v1::WorkerState::Service {
 public:
  struct Info {
    std::string worker_id;
    v1::WorkerRole role = v1::ROLE_BOTH;
    std::string engine;                // e.g. "cpu-avx512"
    v1::KvPoolDescriptor kv_pool = {};  // empty on a prefill-only worker
  };

  // `loop` must outlive the service.
  WorkerStateService(EngineLoop* loop, Info info) : loop_(loop), info_(std::move(info)) {}

  grpc::Status WatchState(grpc::ServerContext* context, const v1::WatchStateRequest* request,
                          grpc::ServerWriter<v1::WorkerStateUpdate>* writer) override;

  // The messages it sends, for tests and for workers that report elsewhere.
  v1::Snapshot MakeSnapshot(const EngineLoop::State& state) const;
  // `step_elapsed`: how long the engine step in progress has run (zero between steps); `now`:
  // the sample's timestamp (the loop's clock).
  static v1::LoadSample MakeLoad(const SchedulerStats& stats, const std::vector<StepInfo>& steps,
                                 absl::Duration step_elapsed, absl::Time now);
  static v1::KvEvent ToProto(const KvEvent& event);

 private:
  EngineLoop* const loop_;
  const Info info_;
};

}  // namespace tandem

#endif  // TANDEM_WORKER_WORKER_STATE_SERVICE_H_
