// tandem.v1.Inference, the client gRPC API of the router: Generate (server stream), Tokenize,
// ListModels. Built on gRPC's callback API, like the relay to the decode worker: a stream holds no
// thread while it waits for tokens, and responses that come while a write to a slow client is in
// flight wait in the call's queue.
#ifndef TANDEM_ROUTER_SERVER_INFERENCE_SERVICE_H_
#define TANDEM_ROUTER_SERVER_INFERENCE_SERVICE_H_

#include "router/server/request_router.h"
#include "tandem/v1/inference.grpc.pb.h"

namespace tandem::router {

class InferenceService final : public v1::Inference::CallbackService {
 public:
  explicit InferenceService(RequestRouter* router) : router_(router) {}

  grpc::ServerWriteReactor<v1::GenerateResponse>* Generate(
      grpc::CallbackServerContext* context, const v1::GenerateRequest* request) override;
  grpc::ServerUnaryReactor* Tokenize(grpc::CallbackServerContext* context,
                                     const v1::TokenizeRequest* request,
                                     v1::TokenizeResponse* response) override;
  grpc::ServerUnaryReactor* ListModels(grpc::CallbackServerContext* context,
                                       const v1::ListModelsRequest* request,
                                       v1::ListModelsResponse* response) override;

 private:
  RequestRouter* const router_;
};

}  // namespace tandem::router

#endif  // TANDEM_ROUTER_SERVER_INFERENCE_SERVICE_H_
