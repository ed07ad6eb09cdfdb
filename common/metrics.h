// Prometheus metrics over prometheus-cpp: one registry and at most one HTTP exposer per process.
//
//   prometheus::Family<prometheus::Counter>& requests =
//       prometheus::BuildCounter().Name("tandem_router_requests_total").Help("...")
//           .Register(tandem::ProcessMetrics());
//   requests.Add({{"outcome", "ok"}}).Increment();
//
//   // in main():
//   ASSIGN_OR_RETURN(int port, tandem::StartProcessMetricsServer("0.0.0.0:9100"));
//
// Metric names and labels are documented in docs/metrics.md. Everything here is thread-safe.
#ifndef TANDEM_COMMON_METRICS_H_
#define TANDEM_COMMON_METRICS_H_

#include <memory>
#include <string>
#include "absl/strings/string_view.h"

#include "absl/status/statusor.h"
#include "prometheus/counter.h"
#include "prometheus/family.h"
#include "prometheus/gauge.h"
#include "prometheus/histogram.h"
#include "prometheus/registry.h"

namespace tandem {

// The process-wide registry. Never destroyed.
prometheus::Registry& ProcessMetrics();

// Starts the process's metrics HTTP server on `bind_address` ("host:port"; port 0 picks a free
// port), serving ProcessMetrics() at `/metrics`. Returns the bound port. There is one such server
// per process: a second call returns FAILED_PRECONDITION; a port that cannot be bound returns
// UNAVAILABLE; a malformed address INVALID_ARGUMENT. The server lives until the process exits.
absl::StatusOr<int> StartProcessMetricsServer(absl::string_view bind_address);

// The port of the running process metrics server, or 0 when none was started.
int ProcessMetricsPort();

// `registry` in the Prometheus text exposition format (version 0.0.4), for servers that expose
// metrics on a port of their own (the router's HTTP API serves /metrics this way).
std::string SerializeMetrics(prometheus::Registry& registry);

// Histogram buckets, in seconds, for request latencies from 1 ms to 80 s (TTFT, end-to-end).
const prometheus::Histogram::BucketBoundaries& RequestLatencyBuckets();
// Histogram buckets, in seconds, for per-token and per-step latencies from 100 us to 10 s.
const prometheus::Histogram::BucketBoundaries& TokenLatencyBuckets();

}  // namespace tandem

#endif  // TANDEM_COMMON_METRICS_H_
