// tandem.v1.Decode on a decode worker: one Generate stream per request. The worker reserves the
// request's KV blocks (after its cached prefix), asks the router's prefill workers in order to
// write the rest of the prompt's K/V into them, falls back to the next one and then to prefilling
// locally when one fails or misses its deadline, then decodes the request in its continuous batch
// and streams the tokens. A request without prefill targets is prefilled here (aggregated mode).
//
// Built on gRPC's callback API: a stream waiting in the queue or between tokens holds no thread;
// the engine thread hands each request's tokens to its stream, which writes them as the client
// takes them (tokens that come while a write is in flight go out together in the next message).
//
// Drainable (common/serve.h): once draining, a new Generate is refused with UNAVAILABLE; the
// streams in progress go on until they end or HandOff ends them with UNAVAILABLE, and both carry
// the trailing metadata kDrainingMetadataKey, so that the router moves the request with the tokens
// so far to another decode worker.
#ifndef TANDEM_DECODE_WORKER_DECODE_SERVICE_H_
#define TANDEM_DECODE_WORKER_DECODE_SERVICE_H_

#include <memory>
#include <string>

#include "absl/container/flat_hash_map.h"
#include "absl/synchronization/mutex.h"
#include "common/keepalive.h"
#include "common/periodic_thread.h"
#include "common/serve.h"
#include "worker/engine_loop.h"
#include "tandem/v1/worker.grpc.pb.h"

namespace tandem {

class DecodeService final : public v1::Decode::CallbackService, public Drainable {
 public:
  struct Options {
    std::string worker_id;
    // Where prefill workers write this worker's blocks; empty: prefill targets are ignored (the
    // worker prefills everything itself). Holds the pool's remote key: it goes only into the
    // PrefillRequest sent to a request's prefill target, on a channel with `security`.
    v1::KvPoolDescriptor kv_pool;
    // Used when the request carries no prefill_timeout_ms.
    absl::Duration default_prefill_timeout = absl::Seconds(30);
    // A stream that has had nothing to send for this long sends a heartbeat
    // (DecodeResponse.heartbeat), so that the router can tell it from a silent worker. > 0;
    // InfiniteDuration: never.
    absl::Duration heartbeat = absl::Seconds(1);
    // Of the channels to the prefill workers (common/keepalive.h).
    KeepaliveOptions keepalive = {};
    // Of the channels to the prefill workers (common/tls.h): plaintext or (mutual) TLS. The
    // worker process builds it from the same --tls_* flags as its server's credentials, so a
    // worker that serves TLS sends its descriptor over TLS only.
    ChannelSecurity security = {};
  };

  // `loop` must outlive the service. Starts the heartbeat thread.
  DecodeService(EngineLoop* loop, Options options);
  // Stops the heartbeat thread. Call after the server has shut down.
  ~DecodeService() override;

  grpc::ServerWriteReactor<v1::DecodeResponse>* Generate(grpc::CallbackServerContext* context,
                                                        const v1::DecodeRequest* request) override;
  grpc::ServerUnaryReactor* Cancel(grpc::CallbackServerContext* context,
                                   const v1::CancelRequest* request,
                                   v1::CancelResponse* response) override;

  // Drainable. The work is the Generate streams, from the call until gRPC is done with it.
  void StartDrain() override;
  bool AwaitIdle(absl::Time deadline) override;
  void HandOff() override;

 private:
  class GenerateCall;
  v1::Prefill::Stub* PrefillStub(const std::string& address);
  // A heartbeat on each stream silent for options_.heartbeat (every options_.heartbeat / 4).
  void SendHeartbeats();

  EngineLoop* const loop_;
  const Options options_;
  absl::Mutex mu_;
  uint64_t next_id_ ABSL_GUARDED_BY(mu_) = 1;
  bool draining_ ABSL_GUARDED_BY(mu_) = false;
  absl::flat_hash_map<std::string, std::shared_ptr<GenerateCall>> calls_ ABSL_GUARDED_BY(mu_);
  // Every stream from Begin until gRPC's OnDone, by call id (for heartbeats).
  absl::flat_hash_map<uint64_t, std::weak_ptr<GenerateCall>> live_ ABSL_GUARDED_BY(mu_);
  std::unique_ptr<PeriodicThread> heartbeat_thread_;
  absl::flat_hash_map<std::string, std::unique_ptr<v1::Prefill::Stub>> stubs_
      ABSL_GUARDED_BY(mu_);
};

}  // namespace tandem

#endif  // TANDEM_DECODE_WORKER_DECODE_SERVICE_H_
