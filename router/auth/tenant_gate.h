// The router's door: API keys per tenant and each tenant's limits (docs/security.md).
//
// An ApiKeyGate holds the keys of a key file (api_keys.h) and re-reads the file when its content
// changes, without a restart. Admit() takes a request's "authorization" value and answers
//
//   UNAUTHENTICATED     no "Bearer <key>", or a key that is not in the file (HTTP 401)
//   RESOURCE_EXHAUSTED  the key's tenant is over its requests per second or its concurrent
//                       requests, with a retry-after hint (HTTP 429 with Retry-After)
//
// or a TenantLease, which holds one of the tenant's concurrent requests until it is destroyed:
// the frontends keep it in the request's state until the reply is written or the client went
// away. Tenants are independent: one over its limits leaves the others' requests alone.
//
// The outside world is injected: time comes from Options::clock; the file is re-read by
// ReloadIfChanged(), which a thread of the gate's own calls every Options::reload_period (tests
// set it to zero and call it themselves). The file is read whole each period and loaded when its
// content differs from the last read; an operator replaces it at once (write a new file, then
// rename it over the old one, as a Kubernetes Secret volume does), else a read may see half of it.
//
// Metrics (docs/metrics.md): tandem_router_tenant_requests_total{tenant,outcome},
// tandem_router_tenant_in_flight_requests{tenant}, tandem_router_auth_failures_total{reason},
// tandem_router_api_key_reloads_total, tandem_router_api_key_reload_failures_total and
// tandem_router_api_keys. Labelled by tenant name only; no key or digest appears in a metric, a
// log line or an error.
//
// Thread-safe.
#ifndef TANDEM_ROUTER_AUTH_TENANT_GATE_H_
#define TANDEM_ROUTER_AUTH_TENANT_GATE_H_

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/clock.h"
#include "common/periodic_thread.h"
#include "router/auth/api_keys.h"

namespace tandem::auth {

// A token bucket: refilled at `rate` tokens a second up to max(1, rate), full at the start.
// Pure (time is an argument); not thread-safe.
class TokenBucket {
 public:
  // REQUIRES: rate > 0.
  TokenBucket(double rate, absl::Time now);
  // Takes a token: nullopt when there was one, else how long until there is one (nothing taken).
  std::optional<absl::Duration> TryTake(absl::Time now);
  // A new rate from `now` on; the tokens already there stay, up to the new capacity.
  void SetRate(double rate, absl::Time now);

 private:
  void Refill(absl::Time now);

  double rate_;
  double capacity_;
  double tokens_;
  absl::Time last_;
};

struct TenantState;

// One admitted request of a tenant: counted among its concurrent requests until destroyed.
// Default-constructed (no tenant) where no key is needed. Move-only; not thread-safe.
class TenantLease {
 public:
  TenantLease() = default;
  explicit TenantLease(std::shared_ptr<TenantState> tenant);
  TenantLease(TenantLease&& other) noexcept = default;
  TenantLease& operator=(TenantLease&& other) noexcept;
  ~TenantLease();

  // The tenant's name; empty when there is none.
  const std::string& tenant() const;
  // Gives the request's place back now (the destructor then does nothing).
  void Release();

 private:
  std::shared_ptr<TenantState> tenant_;
};

class ApiKeyGate {
 public:
  struct Options {
    // The key file (api_keys.h). Required.
    std::string keys_file;
    // How often the file is read for changes; zero: never by the gate's own thread.
    absl::Duration reload_period = absl::Seconds(1);
    // HTTP paths that need no key (AdmitHttp); exact matches.
    std::vector<std::string> open_paths = {"/health", "/metrics"};
    // Time of the rate limits. Not owned; outlives the gate.
    Clock* clock = RealClock();
  };

  // Reads the file. INVALID_ARGUMENT naming the line when it is malformed, NOT_FOUND when it
  // cannot be read, INVALID_ARGUMENT for bad options.
  static absl::StatusOr<std::unique_ptr<ApiKeyGate>> Create(Options options);
  ~ApiKeyGate();

  // A request with the "authorization" value `authorization` (nullopt: none). See the top.
  absl::StatusOr<TenantLease> Admit(std::optional<absl::string_view> authorization);
  // An HTTP request for `path`: an empty lease for an open path, else Admit().
  absl::StatusOr<TenantLease> AdmitHttp(absl::string_view path,
                                        std::optional<absl::string_view> authorization);

  // Re-reads the file and, when its content changed since the last read, loads it. OK when
  // nothing changed or the new keys are in force; otherwise the error (the previous keys stay
  // in force, it is logged once and counted once per change of the file).
  absl::Status ReloadIfChanged();

  // Successful loads after the first, and failed ones.
  int64_t reloads() const;
  int64_t reload_failures() const;
  // Blocks until reloads() >= n or `timeout` passed (real time); says whether it got there.
  bool AwaitReloads(int64_t n, absl::Duration timeout) const;

 private:
  struct Snapshot;
  explicit ApiKeyGate(Options options);
  // Loads `text` (the file's content), keeping the state of the tenants it still has.
  absl::Status Load(absl::string_view text);

  const Options options_;
  mutable absl::Mutex mu_;
  std::shared_ptr<const Snapshot> snapshot_ ABSL_GUARDED_BY(mu_);
  absl::Mutex reload_mu_;  // one reload at a time
  std::optional<std::string> last_read_ ABSL_GUARDED_BY(reload_mu_);  // nullopt: unreadable
  absl::Status last_result_ ABSL_GUARDED_BY(reload_mu_);
  int64_t reloads_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t reload_failures_ ABSL_GUARDED_BY(mu_) = 0;
  std::unique_ptr<PeriodicThread> thread_;  // last: stops before the rest goes
};

}  // namespace tandem::auth

#endif  // TANDEM_ROUTER_AUTH_TENANT_GATE_H_
