// Prometheus metrics over prometheus-cpp: one registry and at most one HTTP exposer per process.
//
//   prometheus::Family<prometheus::Counter>& requests =
//       prometheus::BuildCounter().Name("tandem_router_requests_total").Help("...")
//           .Register(tandem::ProcessMetrics());
//   requests.Add({{"outcome", "ok"}}).Increment();
//
//   // in main():
//   ASSIGN_OR_RETURN(int port, tandem::StartProcessMetricsServer("0.0.0.0:9100"));
//   // or over HTTPS:
//   ASSIGN_OR_RETURN(int port, tandem::StartProcessMetricsServer(
//       {.listen = "0.0.0.0:9100", .tls = {.cert_file = "/tls/tls.crt", .key_file = "/tls/tls.key"}}));
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
#include "common/tls_options.h"

namespace tandem {

// The process-wide registry. Never destroyed.
prometheus::Registry& ProcessMetrics();

struct MetricsServerOptions {
  // "host:port" to listen on; port 0 picks a free port.
  std::string listen;
  // With a certificate and key: HTTPS only (TLS 1.2 and newer) on `listen`, the files read again
  // every tls.reload_period and a changed pair used for the connections that follow, the last
  // good pair kept when a change does not load (common/server_tls_context.h). No client is asked
  // for a certificate (ca_file is not used): a scraper checks the server against the cluster CA.
  // The plain HTTP server behind the TLS terminator listens on a free port of 127.0.0.1
  // (common/https_terminator.h). Without a certificate: plain HTTP on `listen`.
  TlsOptions tls = {};
};

// Starts the process's metrics server, serving ProcessMetrics() at `/metrics`. Returns the port
// of `options.listen`. There is one such server per process: a second call returns
// FAILED_PRECONDITION; a port that cannot be bound returns UNAVAILABLE; a malformed address, or
// TLS files that do not load, INVALID_ARGUMENT. The server lives until the process exits.
absl::StatusOr<int> StartProcessMetricsServer(const MetricsServerOptions& options);
// Plain HTTP on `bind_address`.
absl::StatusOr<int> StartProcessMetricsServer(absl::string_view bind_address);

// The port of the running process metrics server, or 0 when none was started.
int ProcessMetricsPort();
// Whether it serves HTTPS (false when none was started).
bool ProcessMetricsOverTls();

// `registry` in the Prometheus text exposition format (version 0.0.4), for servers that expose
// metrics on a port of their own (the router's HTTP API serves /metrics this way).
std::string SerializeMetrics(prometheus::Registry& registry);

// Histogram buckets, in seconds, for request latencies from 1 ms to 80 s (TTFT, end-to-end).
const prometheus::Histogram::BucketBoundaries& RequestLatencyBuckets();
// Histogram buckets, in seconds, for per-token and per-step latencies from 100 us to 10 s.
const prometheus::Histogram::BucketBoundaries& TokenLatencyBuckets();

}  // namespace tandem

#endif  // TANDEM_COMMON_METRICS_H_
