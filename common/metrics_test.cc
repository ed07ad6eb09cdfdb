#include "common/metrics.h"

#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <string>

#include "absl/strings/str_cat.h"
#include "common/net.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace tandem {
namespace {

using ::testing::HasSubstr;

// Runs Prometheus' own `promtool check metrics` on `exposition`; returns its exit code and output.
std::pair<int, std::string> Promtool(const std::string& exposition) {
  // Tests of this binary run in parallel processes: name the files after this one.
  const std::string base = absl::StrCat(::testing::TempDir(), "/promtool_", ::getpid(), "_",
                                        ::testing::UnitTest::GetInstance()->current_test_info()->name());
  const std::string in = base + ".txt";
  const std::string out = base + ".out";
  std::ofstream(in) << exposition;
  const int rc = std::system(absl::StrCat("promtool check metrics < ", in, " > ", out, " 2>&1").c_str());
  std::ifstream file(out);
  std::string output((std::istreambuf_iterator<char>(file)), std::istreambuf_iterator<char>());
  return {WIFEXITED(rc) ? WEXITSTATUS(rc) : -1, output};
}

TEST(MetricsTest, ServesCountersAndHistogramsOverHttpValidForPromtool) {
  auto& requests = prometheus::BuildCounter()
                       .Name("tandem_test_requests_total")
                       .Help("Requests handled by the test, by outcome.")
                       .Register(ProcessMetrics());
  requests.Add({{"outcome", "ok"}}).Increment(3);
  requests.Add({{"outcome", "rejected"}}).Increment();
  auto& ttft = prometheus::BuildHistogram()
                   .Name("tandem_test_time_to_first_token_seconds")
                   .Help("Time to first token.")
                   .Register(ProcessMetrics())
                   .Add({}, RequestLatencyBuckets());
  ttft.Observe(0.03);
  ttft.Observe(2.0);

  const absl::StatusOr<int> port = StartProcessMetricsServer("127.0.0.1:0");
  ASSERT_TRUE(port.ok()) << port.status();
  ASSERT_GT(*port, 0);
  EXPECT_EQ(ProcessMetricsPort(), *port);

  const auto response = HttpGet({"127.0.0.1", *port}, "/metrics", absl::Seconds(10));
  ASSERT_TRUE(response.ok()) << response.status();
  EXPECT_EQ(response->status, 200);
  EXPECT_THAT(response->body, HasSubstr("tandem_test_requests_total{outcome=\"ok\"} 3"));
  EXPECT_THAT(response->body, HasSubstr("tandem_test_requests_total{outcome=\"rejected\"} 1"));
  EXPECT_THAT(response->body,
              HasSubstr("tandem_test_time_to_first_token_seconds_bucket{le=\"0.04\"} 1"));
  EXPECT_THAT(response->body, HasSubstr("tandem_test_time_to_first_token_seconds_count 2"));

  // Counters move between scrapes.
  requests.Add({{"outcome", "ok"}}).Increment();
  const auto again = HttpGet({"127.0.0.1", *port}, "/metrics", absl::Seconds(10));
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_THAT(again->body, HasSubstr("tandem_test_requests_total{outcome=\"ok\"} 4"));

  // The serialized registry matches what is scraped, and Prometheus' checker accepts it.
  EXPECT_THAT(SerializeMetrics(ProcessMetrics()),
              HasSubstr("tandem_test_requests_total{outcome=\"ok\"} 4"));
  const auto [rc, output] = Promtool(again->body);
  EXPECT_EQ(rc, 0) << "promtool (installed by scripts/setup.sh) rejected the exposition:\n"
                   << output << "\n---\n" << again->body;

  // One server per process.
  EXPECT_EQ(StartProcessMetricsServer("127.0.0.1:0").status().code(),
            absl::StatusCode::kFailedPrecondition);
}

TEST(MetricsTest, PromtoolCatchesABrokenExposition) {
  // Guards the check above: promtool must reject what is wrong, or passing it proves nothing.
  const auto [rc, output] = Promtool("# TYPE x counter\nx{a=\"1\" 3\n");
  EXPECT_NE(rc, 0) << output;
}

TEST(MetricsTest, BadAddressesAreErrors) {
  EXPECT_EQ(StartProcessMetricsServer("nonsense").status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(MetricsTest, BucketsAreSortedAndCoverTheirRange) {
  for (const auto* buckets : {&RequestLatencyBuckets(), &TokenLatencyBuckets()}) {
    ASSERT_FALSE(buckets->empty());
    EXPECT_TRUE(std::is_sorted(buckets->begin(), buckets->end()));
    EXPECT_EQ(std::adjacent_find(buckets->begin(), buckets->end()), buckets->end());
  }
  EXPECT_LE(RequestLatencyBuckets().front(), 0.001);
  EXPECT_GE(RequestLatencyBuckets().back(), 60.0);
  EXPECT_LE(TokenLatencyBuckets().front(), 0.0001);
}

}  // namespace
}  // namespace tandem
