// A request relayed to a decode worker, as the router's frontends see it: the sink that receives
// its responses, and the handle that cancels it.
#ifndef TANDEM_ROUTER_SERVER_RELAYED_CALL_H_
#define TANDEM_ROUTER_SERVER_RELAYED_CALL_H_

#include "absl/status/status.h"
#include "tandem/v1/inference.pb.h"

namespace tandem::router {

// Receives a relayed request's responses and its end, on gRPC's threads, in order; OnDone comes
// exactly once, last. Must not block.
class ResponseSink {
 public:
  virtual ~ResponseSink() = default;
  virtual void OnResponse(const v1::GenerateResponse& response) = 0;
  virtual void OnDone(const absl::Status& status) = 0;
  // A request that RequestRouter::Start left in the admission queue (RelayedCall::queued)
  // started on a worker; before its first OnResponse. Not called for one started at once.
  virtual void OnAdmitted() {}
};

// A request in flight. Cancel() ends it (the decode worker frees its blocks and cancels its
// prefill); the sink still gets OnDone.
class RelayedCall {
 public:
  virtual ~RelayedCall() = default;
  virtual void Cancel() = 0;
  // True when RequestRouter::Start left the request waiting in the router's admission queue:
  // the sink gets OnAdmitted when it starts, or OnDone with RESOURCE_EXHAUSTED (and a
  // retry-after hint, common/status_conversion.h) when it is refused after all.
  virtual bool queued() const { return false; }
};

}  // namespace tandem::router

#endif  // TANDEM_ROUTER_SERVER_RELAYED_CALL_H_
