// What every server process does in main(): serve gRPC services until SIGINT / SIGTERM, and
// then drain -- stop taking new work, let the work in progress finish within a timeout, hand off
// what is left, and stop (docs/failures.md, "Planned shutdown").
#ifndef TANDEM_COMMON_SERVE_H_
#define TANDEM_COMMON_SERVE_H_

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "common/keepalive.h"
#include "grpcpp/grpcpp.h"

namespace tandem {

// A service that finishes its work before its server stops. ServeUntilSignal calls, from its own
// thread and in this order: StartDrain once, AwaitIdle any number of times, HandOff once.
// Implementations are thread-safe against their own RPC handlers.
class Drainable {
 public:
  virtual ~Drainable() = default;
  // From now on new work is refused with UNAVAILABLE; work in progress goes on. A service that
  // reports state to subscribers says from now on that it is draining.
  virtual void StartDrain() = 0;
  // Waits until no work is in progress, or until `deadline`; true when none is.
  virtual bool AwaitIdle(absl::Time deadline) = 0;
  // Ends at once the work still in progress, with UNAVAILABLE, so that its callers carry it on
  // elsewhere, and the long-lived streams that are not work (state subscriptions). Called after
  // AwaitIdle whether or not the work ended.
  virtual void HandOff() = 0;
};

// Trailing metadata (value "1") on a call that a draining service refused or handed off: its
// caller carries the work on elsewhere as a planned move, not as a failure.
inline constexpr char kDrainingMetadataKey[] = "tandem-draining";

// Waits for a termination signal until `deadline` (InfiniteFuture: for as long as it takes);
// true when one came.
using SignalWaiter = std::function<bool(absl::Time deadline)>;

// SIGINT and SIGTERM, which must be blocked in every thread (BlockTerminationSignals).
bool AwaitTerminationSignal(absl::Time deadline);

struct ServeOptions {
  // Of the server (common/keepalive.h).
  KeepaliveOptions keepalive = {};
  // Services to drain after the first signal, in this order (the server's services usually).
  std::vector<Drainable*> drainables = {};
  // How long the drainables' work in progress may run after the first signal before it is
  // handed off. >= 0.
  absl::Duration drain_timeout = absl::ZeroDuration();
  // How long the server's shutdown, after the hand-off, waits for calls still open before it
  // cancels them. >= 0.
  absl::Duration grace = absl::Seconds(5);
  // Where the signals come from; null: AwaitTerminationSignal. Tests give their own.
  SignalWaiter await_signal = nullptr;
  // Of the listening port (common/tls.h: ServerCredentialsFor); null: insecure (plaintext).
  std::shared_ptr<grpc::ServerCredentials> credentials = nullptr;
};

// Builds a gRPC server on `listen` with `services`, the standard health service (serving),
// reflection and `options.keepalive` (common/keepalive.h: it finds a client that stopped
// answering); calls `on_ready` with the bound port; blocks until the first signal. Then:
//   1. the health service says NOT_SERVING (readiness probes fail, load balancers drop it);
//   2. StartDrain on every drainable: new work is refused, subscribers learn it drains;
//   3. waits until every drainable is idle, the drain timeout passes, or a second signal comes;
//   4. HandOff on every drainable: what still runs ends with UNAVAILABLE (its callers move it);
//   5. shuts the server down (calls still open are cancelled after `options.grace`) and returns.
// Each phase is logged. Call before starting threads that should not receive the signals (it
// blocks them in the calling thread and its children). INVALID_ARGUMENT for negative durations;
// UNAVAILABLE when `listen` cannot be bound.
absl::Status ServeUntilSignal(const std::string& listen, const std::vector<grpc::Service*>& services,
                              const std::function<void(int port)>& on_ready,
                              const ServeOptions& options);

// The same without drainables: the server shuts down at the first signal, waiting up to `grace`
// for the calls still open.
absl::Status ServeUntilSignal(const std::string& listen, const std::vector<grpc::Service*>& services,
                              const std::function<void(int port)>& on_ready,
                              const KeepaliveOptions& keepalive = {},
                              absl::Duration grace = absl::Seconds(5));

// Blocks SIGINT and SIGTERM in this thread (and the threads it starts afterwards), so that
// ServeUntilSignal can wait for them. Call first thing in main().
void BlockTerminationSignals();

}  // namespace tandem

#endif  // TANDEM_COMMON_SERVE_H_
