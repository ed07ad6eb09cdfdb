// tandem.v1.Inference, the client gRPC API of the router: Generate (server stream), Tokenize,
// ListModels. Each Generate call holds one server thread while it streams (gRPC's synchronous
// API); the relay to the decode worker does not.
#ifndef TANDEM_ROUTER_SERVER_INFERENCE_SERVICE_H_
#define TANDEM_ROUTER_SERVER_INFERENCE_SERVICE_H_

#include "router/server/request_router.h"
#include "tandem/v1/inference.grpc.pb.h"

namespace tandem::router {

class InferenceService final : public v1::Inference::Service {
 public:
  explicit InferenceService(RequestRouter* router) : router_(router) {}

  grpc::Status Generate(grpc::ServerContext* context, const v1::GenerateRequest* request,
                        grpc::ServerWriter<v1::GenerateResponse>* writer) override;
  grpc::Status Tokenize(grpc::ServerContext* context, const v1::TokenizeRequest* request,
                        v1::TokenizeResponse* response) override;
  grpc::Status ListModels(grpc::ServerContext* context, const v1::ListModelsRequest* request,
                          v1::ListModelsResponse* response) override;

 private:
  RequestRouter* const router_;
};

}  // namespace tandem::router

#endif  // TANDEM_ROUTER_SERVER_INFERENCE_SERVICE_H_
