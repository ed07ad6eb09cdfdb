// tandem.v1.Inference, the client gRPC API of the router: Generate (server stream), Tokenize,
// ListModels. Built on gRPC's callback API, like the relay to the decode worker: a stream holds no
// thread while it waits for tokens, and responses that come while a write to a slow client is in
// flight wait in the call's queue.
#ifndef TANDEM_ROUTER_SERVER_INFERENCE_SERVICE_H_
#define TANDEM_ROUTER_SERVER_INFERENCE_SERVICE_H_

//
// Drainable (common/serve.h), beside the RequestRouter's drain, which refuses new requests and
// counts those in flight: a Generate stream is finished when gRPC is done with it (its last
// response and its status were sent), so that the server's shutdown after the drain has nothing
// left to wait for.
#include <cstdint>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "common/serve.h"
#include "router/auth/tenant_gate.h"
#include "router/server/request_router.h"
#include "tandem/v1/inference.grpc.pb.h"

namespace tandem::router {

class InferenceService final : public v1::Inference::CallbackService, public Drainable {
 public:
  // `api_keys` (not owned, outlives the service; null: no keys): every call needs the
  // "authorization" metadata "Bearer <key>" (UNAUTHENTICATED without one, RESOURCE_EXHAUSTED with
  // retry-after over its tenant's limits); a Generate stream holds its tenant's place until it
  // ends.
  explicit InferenceService(RequestRouter* router, auth::ApiKeyGate* api_keys = nullptr)
      : router_(router), api_keys_(api_keys) {}

  grpc::ServerWriteReactor<v1::GenerateResponse>* Generate(
      grpc::CallbackServerContext* context, const v1::GenerateRequest* request) override;
  grpc::ServerUnaryReactor* Tokenize(grpc::CallbackServerContext* context,
                                     const v1::TokenizeRequest* request,
                                     v1::TokenizeResponse* response) override;
  grpc::ServerUnaryReactor* ListModels(grpc::CallbackServerContext* context,
                                       const v1::ListModelsRequest* request,
                                       v1::ListModelsResponse* response) override;

  // Drainable. The work is every Generate stream, from the call until gRPC's OnDone. New ones are
  // refused, and those still running cut, by the RequestRouter's drain.
  void StartDrain() override {}
  bool AwaitIdle(absl::Time deadline) override;
  void HandOff() override {}

 private:
  friend class GenerateCall;
  void StreamOpened();
  void StreamClosed();
  // The call's admission by api_keys_ (an empty lease when there is none).
  absl::StatusOr<auth::TenantLease> Admit(const grpc::CallbackServerContext& context);

  RequestRouter* const router_;
  auth::ApiKeyGate* const api_keys_;
  absl::Mutex mu_;
  int64_t open_streams_ ABSL_GUARDED_BY(mu_) = 0;  // Generate streams gRPC is not done with
};

}  // namespace tandem::router

#endif  // TANDEM_ROUTER_SERVER_INFERENCE_SERVICE_H_
