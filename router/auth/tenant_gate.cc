#include "router/auth/tenant_gate.h"

#include <openssl/crypto.h>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <sstream>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "common/logging.h"
#include "common/metrics.h"
#include "common/status_conversion.h"
#include "prometheus/counter.h"
#include "prometheus/gauge.h"

namespace tandem::auth {
namespace {

struct GateMetrics {
  prometheus::Family<prometheus::Counter>& requests = prometheus::BuildCounter()
      .Name("tandem_router_tenant_requests_total")
      .Help("Requests with a valid API key by tenant and outcome: admitted, rate_limited (over "
            "its requests per second), concurrency_limited (over its concurrent requests)")
      .Register(ProcessMetrics());
  prometheus::Family<prometheus::Gauge>& in_flight = prometheus::BuildGauge()
      .Name("tandem_router_tenant_in_flight_requests")
      .Help("A tenant's requests admitted and not yet answered (what its concurrency limit "
            "counts)")
      .Register(ProcessMetrics());
  prometheus::Family<prometheus::Counter>& failures = prometheus::BuildCounter()
      .Name("tandem_router_auth_failures_total")
      .Help("Requests refused with 401 (gRPC UNAUTHENTICATED) by reason: missing (no "
            "'Bearer <key>'), wrong (a key that is not in the key file)")
      .Register(ProcessMetrics());
  prometheus::Counter& reloads = prometheus::BuildCounter()
      .Name("tandem_router_api_key_reloads_total")
      .Help("Times the API key file changed and its new keys came into force")
      .Register(ProcessMetrics())
      .Add({});
  prometheus::Counter& reload_failures = prometheus::BuildCounter()
      .Name("tandem_router_api_key_reload_failures_total")
      .Help("Times the API key file changed into something unreadable or malformed (the "
            "previous keys stay in force)")
      .Register(ProcessMetrics())
      .Add({});
  prometheus::Gauge& keys = prometheus::BuildGauge()
      .Name("tandem_router_api_keys")
      .Help("API keys in force")
      .Register(ProcessMetrics())
      .Add({});
};

GateMetrics& Metrics() {
  static GateMetrics* metrics = new GateMetrics();
  return *metrics;
}

// The file's content; nullopt when it cannot be read.
std::optional<std::string> ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return std::nullopt;
  std::ostringstream out;
  out << in.rdbuf();
  if (in.bad()) return std::nullopt;
  return std::move(out).str();
}

}  // namespace

TokenBucket::TokenBucket(double rate, absl::Time now)
    : rate_(rate), capacity_(std::max(1.0, rate)), tokens_(capacity_), last_(now) {}

void TokenBucket::Refill(absl::Time now) {
  if (now > last_) {
    tokens_ = std::min(capacity_, tokens_ + absl::ToDoubleSeconds(now - last_) * rate_);
    last_ = now;
  }
}

std::optional<absl::Duration> TokenBucket::TryTake(absl::Time now) {
  Refill(now);
  if (tokens_ >= 1) {
    tokens_ -= 1;
    return std::nullopt;
  }
  return absl::Seconds((1 - tokens_) / rate_);
}

void TokenBucket::SetRate(double rate, absl::Time now) {
  Refill(now);
  rate_ = rate;
  capacity_ = std::max(1.0, rate);
  tokens_ = std::min(tokens_, capacity_);
}

// A tenant's limits and what they count; shared by the snapshots that have the tenant and the
// leases of its requests.
struct TenantState {
  explicit TenantState(std::string tenant) : name(std::move(tenant)) {
    GateMetrics& m = Metrics();
    admitted = &m.requests.Add({{"tenant", name}, {"outcome", "admitted"}});
    rate_limited = &m.requests.Add({{"tenant", name}, {"outcome", "rate_limited"}});
    concurrency_limited = &m.requests.Add({{"tenant", name}, {"outcome", "concurrency_limited"}});
    in_flight_gauge = &m.in_flight.Add({{"tenant", name}});
  }

  const std::string name;
  prometheus::Counter* admitted;
  prometheus::Counter* rate_limited;
  prometheus::Counter* concurrency_limited;
  prometheus::Gauge* in_flight_gauge;

  absl::Mutex mu;
  TenantLimits limits ABSL_GUARDED_BY(mu);
  std::optional<TokenBucket> bucket ABSL_GUARDED_BY(mu);  // when limits.rps
  int64_t in_flight ABSL_GUARDED_BY(mu) = 0;

  void SetLimits(const TenantLimits& l, absl::Time now) ABSL_LOCKS_EXCLUDED(mu) {
    absl::MutexLock lock(&mu);
    limits = l;
    if (!l.rps.has_value()) {
      bucket.reset();
    } else if (bucket.has_value()) {
      bucket->SetRate(*l.rps, now);
    } else {
      bucket.emplace(*l.rps, now);
    }
  }
};

// The keys in force and their tenants. Immutable once built.
struct ApiKeyGate::Snapshot {
  explicit Snapshot(std::vector<ApiKeyEntry> entries) : table(std::move(entries)) {}
  KeyTable table;
  absl::flat_hash_map<std::string, std::shared_ptr<TenantState>> tenants;
};

TenantLease::TenantLease(std::shared_ptr<TenantState> tenant) : tenant_(std::move(tenant)) {}

TenantLease& TenantLease::operator=(TenantLease&& other) noexcept {
  if (this != &other) {
    Release();
    tenant_ = std::move(other.tenant_);
  }
  return *this;
}

TenantLease::~TenantLease() { Release(); }

const std::string& TenantLease::tenant() const {
  static const std::string* const kNone = new std::string();
  return tenant_ != nullptr ? tenant_->name : *kNone;
}

void TenantLease::Release() {
  if (tenant_ == nullptr) return;
  {
    absl::MutexLock lock(&tenant_->mu);
    --tenant_->in_flight;
  }
  tenant_->in_flight_gauge->Decrement();
  tenant_.reset();
}

ApiKeyGate::ApiKeyGate(Options options) : options_(std::move(options)) {}

ApiKeyGate::~ApiKeyGate() { thread_.reset(); }

absl::StatusOr<std::unique_ptr<ApiKeyGate>> ApiKeyGate::Create(Options options) {
  if (options.keys_file.empty()) return absl::InvalidArgumentError("no API key file given");
  if (options.reload_period < absl::ZeroDuration()) {
    return absl::InvalidArgumentError("the API key file's reload period must be >= 0");
  }
  if (options.clock == nullptr) return absl::InvalidArgumentError("no clock given");
  std::unique_ptr<ApiKeyGate> gate(new ApiKeyGate(std::move(options)));
  const std::optional<std::string> text = ReadFile(gate->options_.keys_file);
  if (!text.has_value()) {
    return absl::NotFoundError(
        absl::StrCat("cannot read the API key file ", gate->options_.keys_file));
  }
  if (absl::Status s = gate->Load(*text); !s.ok()) {
    return absl::InvalidArgumentError(absl::StrCat(gate->options_.keys_file, ": ", s.message()));
  }
  {
    absl::MutexLock lock(&gate->reload_mu_);
    gate->last_read_ = *text;
  }
  if (gate->options_.reload_period > absl::ZeroDuration()) {
    ApiKeyGate* raw = gate.get();
    gate->thread_ = std::make_unique<PeriodicThread>(
        PeriodicThread::Options{.period = gate->options_.reload_period},
        [raw] { raw->ReloadIfChanged().IgnoreError(); });
  }
  return gate;
}

absl::Status ApiKeyGate::Load(absl::string_view text) {
  absl::StatusOr<std::vector<ApiKeyEntry>> entries = ParseApiKeys(text);
  if (!entries.ok()) return entries.status();
  auto next = std::make_shared<Snapshot>(*std::move(entries));
  const absl::Time now = options_.clock->Now();
  absl::MutexLock lock(&mu_);
  for (const ApiKeyEntry& entry : next->table.entries()) {
    if (next->tenants.contains(entry.tenant)) continue;
    std::shared_ptr<TenantState> state;
    if (snapshot_ != nullptr) {
      if (auto it = snapshot_->tenants.find(entry.tenant); it != snapshot_->tenants.end()) {
        state = it->second;  // its bucket and its requests in flight carry on
      }
    }
    if (state == nullptr) state = std::make_shared<TenantState>(entry.tenant);
    state->SetLimits(entry.limits, now);
    next->tenants.emplace(entry.tenant, std::move(state));
  }
  Metrics().keys.Set(static_cast<double>(next->table.entries().size()));
  snapshot_ = std::move(next);
  return absl::OkStatus();
}

absl::Status ApiKeyGate::ReloadIfChanged() {
  absl::MutexLock reload(&reload_mu_);
  std::optional<std::string> text = ReadFile(options_.keys_file);
  if (text == last_read_) return last_result_;
  last_read_ = text;
  if (!text.has_value()) {
    last_result_ = absl::NotFoundError(absl::StrCat("cannot read the API key file ",
                                                    options_.keys_file));
  } else {
    last_result_ = Load(*text);
    if (!last_result_.ok()) {
      last_result_ = absl::InvalidArgumentError(
          absl::StrCat(options_.keys_file, ": ", last_result_.message()));
    }
  }
  absl::MutexLock lock(&mu_);
  if (last_result_.ok()) {
    ++reloads_;
    Metrics().reloads.Increment();
    LOG(INFO) << "API key file " << options_.keys_file << " reloaded: "
              << snapshot_->table.entries().size() << " keys of " << snapshot_->tenants.size()
              << " tenants in force";
  } else {
    ++reload_failures_;
    Metrics().reload_failures.Increment();
    LOG(ERROR) << last_result_.message() << "; the previous "
               << snapshot_->table.entries().size() << " keys stay in force";
  }
  return last_result_;
}

int64_t ApiKeyGate::reloads() const {
  absl::MutexLock lock(&mu_);
  return reloads_;
}

int64_t ApiKeyGate::reload_failures() const {
  absl::MutexLock lock(&mu_);
  return reload_failures_;
}

bool ApiKeyGate::AwaitReloads(int64_t n, absl::Duration timeout) const {
  absl::MutexLock lock(&mu_);
  auto reached = [this, n]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return reloads_ >= n; };
  return mu_.AwaitWithTimeout(absl::Condition(&reached), timeout);
}

absl::StatusOr<TenantLease> ApiKeyGate::AdmitHttp(absl::string_view path,
                                                  std::optional<absl::string_view> authorization) {
  if (std::find(options_.open_paths.begin(), options_.open_paths.end(), path) !=
      options_.open_paths.end()) {
    return TenantLease();
  }
  return Admit(authorization);
}

absl::StatusOr<TenantLease> ApiKeyGate::Admit(std::optional<absl::string_view> authorization) {
  GateMetrics& metrics = Metrics();
  const std::optional<absl::string_view> key =
      authorization.has_value() ? BearerKey(*authorization) : std::nullopt;
  if (!key.has_value()) {
    metrics.failures.Add({{"reason", "missing"}}).Increment();
    return absl::UnauthenticatedError(
        "no API key: send it as 'Authorization: Bearer <key>' (gRPC: the 'authorization' "
        "metadata)");
  }
  const KeyDigest digest = DigestOf(*key);
  std::shared_ptr<const Snapshot> snapshot;
  {
    absl::MutexLock lock(&mu_);
    snapshot = snapshot_;
  }
  const ApiKeyEntry* entry = snapshot->table.Find(digest);
  if (entry == nullptr) {
    metrics.failures.Add({{"reason", "wrong"}}).Increment();
    return absl::UnauthenticatedError("invalid API key");
  }
  const std::shared_ptr<TenantState>& tenant = snapshot->tenants.at(entry->tenant);
  {
    absl::MutexLock lock(&tenant->mu);
    if (tenant->limits.concurrency.has_value() &&
        tenant->in_flight >= *tenant->limits.concurrency) {
      tenant->concurrency_limited->Increment();
      return WithRetryAfter(
          absl::ResourceExhaustedError(absl::StrCat(
              "tenant '", tenant->name, "' is at its limit of ", *tenant->limits.concurrency,
              " concurrent requests; retry when one of them has finished")),
          absl::Seconds(1));
    }
    if (tenant->bucket.has_value()) {
      if (std::optional<absl::Duration> wait = tenant->bucket->TryTake(options_.clock->Now());
          wait.has_value()) {
        tenant->rate_limited->Increment();
        return WithRetryAfter(
            absl::ResourceExhaustedError(absl::StrCat("tenant '", tenant->name,
                                                      "' is over its limit of ",
                                                      *tenant->limits.rps, " requests per second")),
            *wait);
      }
    }
    ++tenant->in_flight;
  }
  tenant->admitted->Increment();
  tenant->in_flight_gauge->Increment();
  return TenantLease(tenant);
}

}  // namespace tandem::auth
