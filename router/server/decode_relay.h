// The relay of one placed request to its decode worker: a Decode.Generate stream (gRPC's
// callback API, no thread per request) whose responses go to the client's ResponseSink. When the
// decode worker dies, breaks the stream, or goes silent past the stall timeout (StallWatch)
// before the last response, the request moves to another decode worker with the tokens generated
// so far (prior_output_token_ids), up to RouterOptions::max_migrations times, and the client's
// stream goes on: the new worker replays those tokens, so greedy and seeded output are the same as
// if nothing had happened. Heartbeats (DecodeResponse.heartbeat) only say the worker is alive.
#ifndef TANDEM_ROUTER_SERVER_DECODE_RELAY_H_
#define TANDEM_ROUTER_SERVER_DECODE_RELAY_H_

#include <memory>

#include "absl/time/time.h"
#include "router/placement/placement.h"
#include "router/server/registry.h"
#include "router/server/request_router.h"
#include "tandem/v1/worker.grpc.pb.h"

namespace tandem::router {

// Starts relaying `request` (placed on `route`; `placement` is what placed it, for moves) to the
// decode worker behind `stub`. `arrival`: when the request reached the router; `deadline`: the
// client's. The sink gets every response, then OnDone once. Cancel() on the result ends it.
std::shared_ptr<RelayedCall> StartDecodeRelay(RequestRouter* router, Route route,
                                              v1::Decode::Stub* stub, v1::DecodeRequest request,
                                              ResponseSink* sink, placement::Request placement,
                                              absl::Time arrival, absl::Time deadline,
                                              int max_migrations);

}  // namespace tandem::router

#endif  // TANDEM_ROUTER_SERVER_DECODE_RELAY_H_
