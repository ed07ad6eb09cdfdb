// tandem.v1.Prefill on a prefill worker: computes a prompt (reusing its own prefix cache, batched
// with the other prompts in its engine), writes each layer's K/V straight into the decode
// worker's blocks as soon as the layer is computed, and answers with the first token once every
// write is in place.
//
// Built on gRPC's callback API, and nothing in it waits: a call holds no thread while its prompt
// queues, computes or transfers. The engine keeps a prompt's blocks after its last step
// (GenerationRequest::hold_kv) until the transport reports the writes that read them done, so a
// slow or stuck decode peer delays only its own request, never the engine's batch.
//
// The destination is a grant (kvtransfer/kv_grant.h): checked before anything is written
// (INVALID_ARGUMENT / FAILED_PRECONDITION naming the fault), and every write goes through a
// GrantedConnection that refuses other blocks and, once the call answered or was given up, any
// write at all. Cancel answers once the call has (its writes ended): after it, nothing of that
// request lands in the destination (docs/security.md, "The KV path").
//
// Drainable (common/serve.h): once draining, a new Prefill is refused with UNAVAILABLE (the decode
// worker asks its next prefill worker, or prefills itself); the calls in progress finish, or
// HandOff gives them up with UNAVAILABLE.
#ifndef TANDEM_PREFILL_WORKER_PREFILL_SERVICE_H_
#define TANDEM_PREFILL_WORKER_PREFILL_SERVICE_H_

#include <memory>
#include <string>

#include "absl/container/flat_hash_map.h"
#include "absl/synchronization/mutex.h"
#include "common/serve.h"
#include "common/timer_queue.h"
#include "kvtransfer/kv_transport.h"
#include "tandem/v1/worker.grpc.pb.h"
#include "worker/engine_loop.h"

namespace tandem {

class PrefillService final : public v1::Prefill::CallbackService, public Drainable {
 public:
  struct Options {
    std::string worker_id;
    // Used when the request carries no timeout_ms.
    absl::Duration default_timeout = absl::Seconds(30);
    // A prefill given up (its caller went away, or its deadline passed) whose KV writes have not
    // ended this long after: its connection is cancelled, which ends them at once (and the other
    // writes on it) and lands none of them later, so that its blocks can be freed here and the
    // decode worker can reuse its own. The peer is then most likely unreachable; the next
    // request connects again. The call answers once its writes ended, or 10 x abandon_grace
    // after it was given up (its blocks then stay held until the writes end).
    absl::Duration abandon_grace = absl::Seconds(1);
    // Runs the deadlines and abandon_grace, on its clock. Null: the service's own queue over
    // the real clock. Must outlive the service.
    TimerQueue* timers = nullptr;
  };

  // `loop` and `transport` (with the loop's pool registered) must outlive the service.
  PrefillService(EngineLoop* loop, kvtransfer::KvTransport* transport, Options options);
  // Stops the service's own timers. Call after the server has shut down.
  ~PrefillService() override;

  grpc::ServerUnaryReactor* Prefill(grpc::CallbackServerContext* context,
                                    const v1::PrefillRequest* request,
                                    v1::PrefillResponse* response) override;
  grpc::ServerUnaryReactor* Cancel(grpc::CallbackServerContext* context,
                                   const v1::CancelRequest* request,
                                   v1::CancelResponse* response) override;

  // Drainable. The work is the Prefill calls, from the call until gRPC is done with it.
  void StartDrain() override;
  bool AwaitIdle(absl::Time deadline) override;
  void HandOff() override;

 private:
  class PrefillCall;

  // A connection to the destination pool, reused across requests until it breaks
  // (ForgetConnection).
  absl::StatusOr<std::shared_ptr<kvtransfer::Connection>> ConnectionTo(
      const v1::KvDestination& destination, const kvtransfer::PoolDescriptor& pool,
      absl::Time deadline);
  // Drops `connection` from the cache (a broken connection stays broken: the next request to
  // that pool connects again).
  void ForgetConnection(const kvtransfer::Connection* connection);

  EngineLoop* const loop_;
  kvtransfer::KvTransport* const transport_;
  const Options options_;
  std::unique_ptr<TimerQueue> own_timers_;  // when Options::timers is null
  TimerQueue* const timers_;
  absl::Mutex mu_;
  uint64_t next_id_ ABSL_GUARDED_BY(mu_) = 1;
  bool draining_ ABSL_GUARDED_BY(mu_) = false;
  int64_t active_ ABSL_GUARDED_BY(mu_) = 0;  // Prefill calls taken and not done
  // Calls by request id, for the Cancel RPC.
  absl::flat_hash_map<std::string, std::weak_ptr<PrefillCall>> calls_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<std::string, std::shared_ptr<kvtransfer::Connection>> connections_
      ABSL_GUARDED_BY(mu_);
};

}  // namespace tandem

#endif  // TANDEM_PREFILL_WORKER_PREFILL_SERVICE_H_
