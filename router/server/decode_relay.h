// The relay of one placed request to its decode worker: a Decode.Generate stream (gRPC's
// callback API, no thread per request) whose responses go to the client's ResponseSink. When the
// decode worker dies, breaks the stream, or goes silent past the stall timeout (StallWatch)
// before the last response, the request moves to another decode worker with the tokens generated
// so far (prior_output_token_ids), up to RouterOptions::max_migrations times, and the client's
// stream goes on: the new worker replays those tokens, so greedy and seeded output are the same as
// if nothing had happened. Heartbeats (DecodeResponse.heartbeat) only say the worker is alive.
// The relay logs the request's placement and its end (outcome, tokens, latencies) at INFO, and
// each move at WARNING, tagged with its trace (common/trace_context.h).
#ifndef TANDEM_ROUTER_SERVER_DECODE_RELAY_H_
#define TANDEM_ROUTER_SERVER_DECODE_RELAY_H_

#include <memory>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_set.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/clock.h"
#include "common/trace_context.h"
#include "router/placement/placement.h"
#include "router/server/registry.h"
#include "router/server/relayed_call.h"
#include "router/server/stall_watch.h"
#include "tandem/v1/worker.grpc.pb.h"

namespace tandem::router {

// The Decode.Generate calls a host's relays have open: each from its start until its
// grpc::ClientContext is destroyed, which is after the relay's sink got OnDone (the thread that
// delivered OnDone still holds the call for a moment, and a Cancel racing with the end may hold it
// longer). Whoever owns the channels the calls run on (the host's stubs) waits here for none
// before it destroys them: a sink's OnDone alone does not say the call is gone. Thread-safe.
class DecodeStreams {
 public:
  // One open call; the relay keeps it as long as the call's ClientContext lives.
  class Lease {
   public:
    explicit Lease(DecodeStreams* owner) : owner_(owner) { owner_->Change(+1); }
    Lease(const Lease&) = delete;
    Lease& operator=(const Lease&) = delete;
    ~Lease() { owner_->Change(-1); }

   private:
    DecodeStreams* const owner_;
  };

  int64_t open() {
    absl::MutexLock lock(&mu_);
    return open_;
  }
  // Waits until no call is open, or until `deadline`; true when none is.
  bool AwaitNone(absl::Time deadline) {
    absl::MutexLock lock(&mu_);
    auto none = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return open_ == 0; };
    return mu_.AwaitWithDeadline(absl::Condition(&none), deadline);
  }

 private:
  void Change(int64_t delta) {
    absl::MutexLock lock(&mu_);
    open_ += delta;
  }
  absl::Mutex mu_;
  int64_t open_ ABSL_GUARDED_BY(mu_) = 0;
};

// What a relay needs of the router: a new placement when its request moves, the registry that
// counts its route, the stall watch and the time. RequestRouter is one; a test's fake is another.
// Thread-safe; must outlive the relays it starts, which it learns from decode_streams(), not from
// the sinks' OnDone.
class RelayHost {
 public:
  virtual ~RelayHost() = default;
  // Places `request` over the ready workers but those whose id is in `avoid`: the route and the
  // decode worker's stub (owned by the host, valid while it lives). UNAVAILABLE when no worker
  // can take it.
  virtual absl::StatusOr<Route> PlaceForRelay(const placement::Request& request,
                                              const absl::flat_hash_set<std::string>& avoid,
                                              v1::Decode::Stub** stub) = 0;
  // Where the relay counts its route's progress, first token, latencies and end (Release, once
  // per route).
  virtual Registry& registry() = 0;
  // Watches each decode stream for silence; the relay adds its streams.
  virtual StallWatch& stall_watch() = 0;
  // The time of the relay's measurements (TTFT, latencies, progress) and of the stall watch.
  virtual Clock* clock() const = 0;
  // Counts the relays' calls until each one's ClientContext is gone. The host destroys its stubs
  // (their channels) only once none is open.
  virtual DecodeStreams& decode_streams() = 0;
};

// A placed request, ready to relay.
struct RelayedRequest {
  // Where it was placed, and its decode worker's stub.
  Route route;
  v1::Decode::Stub* stub = nullptr;
  // What goes to the decode worker.
  v1::DecodeRequest request;
  // The router's span of the request's trace: its log lines carry it, and every attempt (a
  // migrated request's too) sends it to its decode worker as the parent (`traceparent`
  // metadata). A new trace when the caller has none.
  TraceContext trace = TraceContext::NewTrace();
  // What placed it: placed again from this, away from failed workers, when it moves.
  placement::Request placement;
  // When it reached the router (the host's clock), and the client's deadline (the system clock,
  // as gRPC's deadlines are; InfiniteFuture: none).
  absl::Time arrival;
  absl::Time deadline = absl::InfiniteFuture();
  // How many times it may move to another decode worker.
  int max_migrations = 0;
};

// Starts relaying `relayed` to its decode worker. The sink gets every response (heartbeats are
// not relayed), then OnDone once. Cancel() on the result ends it.
std::shared_ptr<RelayedCall> StartDecodeRelay(RelayHost* host, RelayedRequest relayed,
                                              ResponseSink* sink);

}  // namespace tandem::router

#endif  // TANDEM_ROUTER_SERVER_DECODE_RELAY_H_
