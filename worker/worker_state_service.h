// tandem.v1.WorkerState on a worker: a snapshot of its prefix cache and load, then its KV events as
// they happen and a load sample every interval (DESIGN.md §4). A subscriber that fell behind the
// kept event history gets a new snapshot.
//
// Drainable (common/serve.h): from StartDrain every sample says `draining` (one goes out at once),
// so that the routers place nothing more here; HandOff ends the streams (OK), which a router then
// takes for the worker leaving, not failing. Its streams are not work that a drain waits for.
#ifndef TANDEM_WORKER_WORKER_STATE_SERVICE_H_
#define TANDEM_WORKER_WORKER_STATE_SERVICE_H_

#include <atomic>
#include <string>

#include "common/serve.h"
#include "worker/engine_loop.h"
#include "tandem/v1/worker.grpc.pb.h"

namespace tandem {

class WorkerStateService final : public v1::WorkerState::Service, public Drainable {
 public:
  struct Info {
    std::string worker_id;
    v1::WorkerRole role = v1::ROLE_BOTH;
    std::string engine;                // e.g. "cpu-avx512"
    // Empty on a prefill-only worker. Snapshots carry only its kvtransfer::PublicPart (no remote
    // key, no address), whatever is given here.
    v1::KvPoolDescriptor kv_pool = {};
  };

  // `loop` must outlive the service.
  WorkerStateService(EngineLoop* loop, Info info) : loop_(loop), info_(std::move(info)) {}

  grpc::Status WatchState(grpc::ServerContext* context, const v1::WatchStateRequest* request,
                          grpc::ServerWriter<v1::WorkerStateUpdate>* writer) override;

  // Drainable. Thread-safe.
  void StartDrain() override { draining_ = true; }
  bool AwaitIdle(absl::Time /*deadline*/) override { return true; }
  void HandOff() override { stopped_ = true; }

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
  std::atomic<bool> draining_{false};  // in every sample from now on
  std::atomic<bool> stopped_{false};   // the streams end
};

}  // namespace tandem

#endif  // TANDEM_WORKER_WORKER_STATE_SERVICE_H_
