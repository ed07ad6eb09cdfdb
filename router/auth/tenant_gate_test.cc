#include "router/auth/tenant_gate.h"

#include <cstdio>
#include <fstream>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "common/clock.h"
#include "common/metrics.h"
#include "common/status_conversion.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace tandem::auth {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

TEST(TokenBucket, HoldsMaxOfOneAndRateAndRefillsAtRate) {
  FakeClock clock;
  TokenBucket bucket(4, clock.Now());  // burst of 4
  for (int i = 0; i < 4; ++i) EXPECT_EQ(bucket.TryTake(clock.Now()), std::nullopt) << i;
  std::optional<absl::Duration> wait = bucket.TryTake(clock.Now());
  ASSERT_TRUE(wait.has_value());
  EXPECT_EQ(*wait, absl::Milliseconds(250));
  clock.Advance(absl::Milliseconds(100));
  EXPECT_EQ(bucket.TryTake(clock.Now()), absl::Milliseconds(150));  // nothing was taken
  clock.Advance(absl::Milliseconds(150));
  EXPECT_EQ(bucket.TryTake(clock.Now()), std::nullopt);
  EXPECT_TRUE(bucket.TryTake(clock.Now()).has_value());
  clock.Advance(absl::Hours(1));  // refills up to the burst, no further
  for (int i = 0; i < 4; ++i) EXPECT_EQ(bucket.TryTake(clock.Now()), std::nullopt) << i;
  EXPECT_TRUE(bucket.TryTake(clock.Now()).has_value());

  TokenBucket slow(0.5, clock.Now());  // below 1 a second: a burst of 1
  EXPECT_EQ(slow.TryTake(clock.Now()), std::nullopt);
  EXPECT_EQ(slow.TryTake(clock.Now()), absl::Seconds(2));
  clock.Advance(absl::Seconds(2));
  EXPECT_EQ(slow.TryTake(clock.Now()), std::nullopt);
}

TEST(TokenBucket, SetRateKeepsTokensUpToTheNewCapacity) {
  FakeClock clock;
  TokenBucket bucket(10, clock.Now());
  bucket.SetRate(2, clock.Now());
  EXPECT_EQ(bucket.TryTake(clock.Now()), std::nullopt);
  EXPECT_EQ(bucket.TryTake(clock.Now()), std::nullopt);
  EXPECT_EQ(bucket.TryTake(clock.Now()), absl::Milliseconds(500));
}

// A key file in the test's temporary folder.
class GateTest : public ::testing::Test {
 protected:
  void SetUp() override {
    path_ = absl::StrCat(::testing::TempDir(), "/keys_",
                         ::testing::UnitTest::GetInstance()->current_test_info()->name());
  }
  void TearDown() override { std::remove(path_.c_str()); }

  // Replaces the file at once, as an operator should (a reload never sees half of it).
  void Write(const std::string& text) {
    const std::string next = path_ + ".next";
    {
      std::ofstream out(next, std::ios::trunc);
      out << text;
    }
    ASSERT_EQ(std::rename(next.c_str(), path_.c_str()), 0);
  }
  std::unique_ptr<ApiKeyGate> Gate(const std::string& text) {
    Write(text);
    absl::StatusOr<std::unique_ptr<ApiKeyGate>> gate =
        ApiKeyGate::Create({.keys_file = path_, .reload_period = absl::ZeroDuration(),
                            .clock = &clock_});
    EXPECT_TRUE(gate.ok()) << gate.status();
    return gate.ok() ? *std::move(gate) : nullptr;
  }
  static std::string Bearer(absl::string_view key) { return absl::StrCat("Bearer ", key); }

  FakeClock clock_;
  std::string path_;
};

TEST_F(GateTest, RefusesAMissingOrMalformedFileAtStart) {
  absl::StatusOr<std::unique_ptr<ApiKeyGate>> gate =
      ApiKeyGate::Create({.keys_file = path_ + "_absent", .clock = &clock_});
  EXPECT_EQ(gate.status().code(), absl::StatusCode::kNotFound);
  Write(absl::StrCat("# ok\n", ApiKeyLine("a", "k", {}), "\nb sha256:12\n"));
  gate = ApiKeyGate::Create({.keys_file = path_, .clock = &clock_});
  EXPECT_EQ(gate.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(gate.status().message(), HasSubstr("line 3:"));
  EXPECT_THAT(gate.status().message(), HasSubstr(path_));
}

TEST_F(GateTest, MissingAndWrongKeysAreUnauthenticated) {
  std::unique_ptr<ApiKeyGate> gate = Gate(ApiKeyLine("a", "key-a", {}));
  ASSERT_NE(gate, nullptr);
  for (const std::optional<absl::string_view> header :
       {std::optional<absl::string_view>(), std::optional<absl::string_view>("key-a"),
        std::optional<absl::string_view>("Basic key-a"),
        std::optional<absl::string_view>("Bearer")}) {
    absl::StatusOr<TenantLease> lease = gate->Admit(header);
    EXPECT_EQ(lease.status().code(), absl::StatusCode::kUnauthenticated);
    EXPECT_THAT(lease.status().message(), HasSubstr("no API key"));
  }
  for (absl::string_view wrong : {"key-b", "key-a ", "key-", "KEY-A"}) {
    absl::StatusOr<TenantLease> lease = gate->Admit(absl::StrCat("Bearer ", wrong, "x"));
    EXPECT_EQ(lease.status().code(), absl::StatusCode::kUnauthenticated);
    EXPECT_EQ(lease.status().message(), "invalid API key");
  }
  absl::StatusOr<TenantLease> lease = gate->Admit(Bearer("key-a"));
  ASSERT_TRUE(lease.ok()) << lease.status();
  EXPECT_EQ(lease->tenant(), "a");
}

TEST_F(GateTest, OpenPathsNeedNoKey) {
  std::unique_ptr<ApiKeyGate> gate = Gate(ApiKeyLine("a", "key-a", {}));
  ASSERT_NE(gate, nullptr);
  EXPECT_TRUE(gate->AdmitHttp("/health", std::nullopt).ok());
  EXPECT_TRUE(gate->AdmitHttp("/metrics", std::nullopt).ok());
  EXPECT_EQ(gate->AdmitHttp("/metrics/", std::nullopt).status().code(),
            absl::StatusCode::kUnauthenticated);
  EXPECT_EQ(gate->AdmitHttp("/v1/models", std::nullopt).status().code(),
            absl::StatusCode::kUnauthenticated);
  EXPECT_EQ(gate->AdmitHttp("/v1/models", Bearer("key-a"))->tenant(), "a");

  Write(ApiKeyLine("a", "key-a", {}));
  absl::StatusOr<std::unique_ptr<ApiKeyGate>> closed = ApiKeyGate::Create(
      {.keys_file = path_, .reload_period = absl::ZeroDuration(), .open_paths = {},
       .clock = &clock_});
  ASSERT_TRUE(closed.ok());
  EXPECT_EQ((*closed)->AdmitHttp("/metrics", std::nullopt).status().code(),
            absl::StatusCode::kUnauthenticated);
}

TEST_F(GateTest, ConcurrencyIsHeldByLeasesPerTenant) {
  std::unique_ptr<ApiKeyGate> gate = Gate(absl::StrCat(ApiKeyLine("a", "key-a", {.concurrency = 2}),
                                                       "\n", ApiKeyLine("a", "key-a2", {.concurrency = 2}),
                                                       "\n", ApiKeyLine("b", "key-b", {.concurrency = 1})));
  ASSERT_NE(gate, nullptr);
  absl::StatusOr<TenantLease> first = gate->Admit(Bearer("key-a"));
  absl::StatusOr<TenantLease> second = gate->Admit(Bearer("key-a2"));  // the tenant's other key
  ASSERT_TRUE(first.ok() && second.ok());
  absl::StatusOr<TenantLease> third = gate->Admit(Bearer("key-a"));
  EXPECT_EQ(third.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(third.status().message(), HasSubstr("limit of 2 concurrent requests"));
  EXPECT_EQ(RetryAfter(third.status()), absl::Seconds(1));
  // Another tenant is unaffected.
  absl::StatusOr<TenantLease> other = gate->Admit(Bearer("key-b"));
  ASSERT_TRUE(other.ok());
  EXPECT_EQ(gate->Admit(Bearer("key-b")).status().code(), absl::StatusCode::kResourceExhausted);
  // A lease moved keeps its place; one destroyed gives it back.
  TenantLease moved = *std::move(first);
  EXPECT_EQ(gate->Admit(Bearer("key-a")).status().code(), absl::StatusCode::kResourceExhausted);
  moved = TenantLease();
  absl::StatusOr<TenantLease> again = gate->Admit(Bearer("key-a"));
  EXPECT_TRUE(again.ok()) << again.status();
  other->Release();
  EXPECT_TRUE(gate->Admit(Bearer("key-b")).ok());
}

TEST_F(GateTest, RateLimitsPerTenantWithRetryAfter) {
  std::unique_ptr<ApiKeyGate> gate = Gate(absl::StrCat(ApiKeyLine("a", "key-a", {.rps = 2}), "\n",
                                                       ApiKeyLine("b", "key-b", {})));
  ASSERT_NE(gate, nullptr);
  EXPECT_TRUE(gate->Admit(Bearer("key-a")).ok());
  EXPECT_TRUE(gate->Admit(Bearer("key-a")).ok());
  absl::StatusOr<TenantLease> over = gate->Admit(Bearer("key-a"));
  EXPECT_EQ(over.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(over.status().message(), HasSubstr("limit of 2 requests per second"));
  EXPECT_EQ(RetryAfter(over.status()), absl::Milliseconds(500));
  for (int i = 0; i < 100; ++i) EXPECT_TRUE(gate->Admit(Bearer("key-b")).ok());  // no limits
  clock_.Advance(absl::Milliseconds(499));
  EXPECT_FALSE(gate->Admit(Bearer("key-a")).ok());
  clock_.Advance(absl::Milliseconds(1));
  EXPECT_TRUE(gate->Admit(Bearer("key-a")).ok());
}

TEST_F(GateTest, ReloadRevokesAddsAndKeepsThePreviousKeysOnAMalformedFile) {
  std::unique_ptr<ApiKeyGate> gate =
      Gate(absl::StrCat(ApiKeyLine("a", "key-a", {.concurrency = 1}), "\n",
                        ApiKeyLine("b", "key-b", {})));
  ASSERT_NE(gate, nullptr);
  EXPECT_TRUE(gate->ReloadIfChanged().ok());  // unchanged: no reload
  EXPECT_EQ(gate->reloads(), 0);
  absl::StatusOr<TenantLease> held = gate->Admit(Bearer("key-a"));
  ASSERT_TRUE(held.ok());

  // key-b revoked, key-c added; tenant a's request in flight still counts against its limit.
  Write(absl::StrCat(ApiKeyLine("a", "key-a", {.concurrency = 1}), "\n",
                     ApiKeyLine("c", "key-c", {})));
  EXPECT_TRUE(gate->ReloadIfChanged().ok());
  EXPECT_EQ(gate->reloads(), 1);
  EXPECT_EQ(gate->Admit(Bearer("key-b")).status().code(), absl::StatusCode::kUnauthenticated);
  EXPECT_TRUE(gate->Admit(Bearer("key-c")).ok());
  EXPECT_EQ(gate->Admit(Bearer("key-a")).status().code(), absl::StatusCode::kResourceExhausted);

  // Malformed: refused once per change, and the keys in force stay.
  Write(absl::StrCat(ApiKeyLine("c", "key-c", {}), "\nd sha256:nothex\n"));
  absl::Status failed = gate->ReloadIfChanged();
  EXPECT_EQ(failed.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(failed.message(), HasSubstr("line 2:"));
  EXPECT_EQ(gate->reload_failures(), 1);
  EXPECT_FALSE(gate->ReloadIfChanged().ok());
  EXPECT_EQ(gate->reload_failures(), 1);
  EXPECT_TRUE(gate->Admit(Bearer("key-c")).ok());
  EXPECT_EQ(gate->Admit(Bearer("key-a")).status().code(), absl::StatusCode::kResourceExhausted);

  // Gone: also kept.
  std::remove(path_.c_str());
  EXPECT_EQ(gate->ReloadIfChanged().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(gate->reload_failures(), 2);
  EXPECT_TRUE(gate->Admit(Bearer("key-c")).ok());

  // Fixed: a's limit raised applies to its request in flight too.
  Write(ApiKeyLine("a", "key-a", {.concurrency = 2}));
  EXPECT_TRUE(gate->ReloadIfChanged().ok());
  EXPECT_EQ(gate->reloads(), 2);
  EXPECT_TRUE(gate->Admit(Bearer("key-a")).ok());
  EXPECT_EQ(gate->Admit(Bearer("key-c")).status().code(), absl::StatusCode::kUnauthenticated);
}

TEST_F(GateTest, TheGatesOwnThreadReloads) {
  Write(ApiKeyLine("a", "key-a", {}));
  absl::StatusOr<std::unique_ptr<ApiKeyGate>> gate = ApiKeyGate::Create(
      {.keys_file = path_, .reload_period = absl::Milliseconds(1), .clock = &clock_});
  ASSERT_TRUE(gate.ok());
  Write(ApiKeyLine("b", "key-b", {}));
  ASSERT_TRUE((*gate)->AwaitReloads(1, absl::Seconds(60)));
  EXPECT_TRUE((*gate)->Admit(Bearer("key-b")).ok());
  EXPECT_FALSE((*gate)->Admit(Bearer("key-a")).ok());
}

TEST_F(GateTest, MetricsCountByTenantAndNeverShowAKey) {
  std::unique_ptr<ApiKeyGate> gate = Gate(absl::StrCat(
      ApiKeyLine("metrics-tenant", "secret-key-xyz", {.rps = 1, .concurrency = 1})));
  ASSERT_NE(gate, nullptr);
  absl::StatusOr<TenantLease> held = gate->Admit(Bearer("secret-key-xyz"));
  ASSERT_TRUE(held.ok());
  EXPECT_FALSE(gate->Admit(Bearer("secret-key-xyz")).ok());  // concurrency
  held->Release();
  EXPECT_FALSE(gate->Admit(Bearer("secret-key-xyz")).ok());  // rate
  EXPECT_FALSE(gate->Admit(Bearer("secret-key-wrong")).ok());
  const std::string text = SerializeMetrics(ProcessMetrics());
  EXPECT_THAT(text, HasSubstr("tandem_router_tenant_requests_total{outcome=\"admitted\","
                              "tenant=\"metrics-tenant\"} 1"));
  EXPECT_THAT(text, HasSubstr("tandem_router_tenant_requests_total{outcome=\"rate_limited\","
                              "tenant=\"metrics-tenant\"} 1"));
  EXPECT_THAT(text, HasSubstr("tandem_router_tenant_requests_total{outcome="
                              "\"concurrency_limited\",tenant=\"metrics-tenant\"} 1"));
  EXPECT_THAT(text, HasSubstr("tandem_router_tenant_in_flight_requests{tenant=\"metrics-tenant\"} 0"));
  EXPECT_THAT(text, HasSubstr("tandem_router_auth_failures_total{reason=\"wrong\"}"));
  EXPECT_THAT(text, Not(HasSubstr("secret-key")));
}

}  // namespace
}  // namespace tandem::auth
