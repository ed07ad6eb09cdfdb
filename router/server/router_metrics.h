// The router's request metrics (docs/metrics.md), with vLLM's names where vLLM has the same
// histogram: one set per process, shared by the request path's files (request_router.cc,
// decode_relay.cc).
#ifndef TANDEM_ROUTER_SERVER_ROUTER_METRICS_H_
#define TANDEM_ROUTER_SERVER_ROUTER_METRICS_H_

#include "common/metrics.h"
#include "prometheus/counter.h"
#include "prometheus/gauge.h"
#include "prometheus/histogram.h"

namespace tandem::router {

struct RouterMetrics {
  prometheus::Family<prometheus::Counter>& requests = prometheus::BuildCounter()
      .Name("tandem_router_requests_total")
      .Help("Requests by outcome: ok, error, cancelled, rejected (refused before placement)")
      .Register(ProcessMetrics());
  prometheus::Family<prometheus::Counter>& placements = prometheus::BuildCounter()
      .Name("tandem_router_placements_total")
      .Help("Placement decisions by policy, prefill location (local on the decode worker or remote) "
            "and the reason for it")
      .Register(ProcessMetrics());
  prometheus::Family<prometheus::Counter>& admissions = prometheus::BuildCounter()
      .Name("tandem_router_admissions_total")
      .Help("Admission verdicts at arrival: admit (started at once), queue, reject")
      .Register(ProcessMetrics());
  prometheus::Family<prometheus::Counter>& rejections = prometheus::BuildCounter()
      .Name("tandem_router_rejections_total")
      .Help("Requests refused by admission, by reason: slo_unreachable, queue_full, displaced, "
            "expired")
      .Register(ProcessMetrics());
  prometheus::Gauge& queued = prometheus::BuildGauge()
      .Name("tandem_router_admission_queue_requests")
      .Help("Requests waiting in the router's admission queue")
      .Register(ProcessMetrics())
      .Add({});
  prometheus::Histogram& queue_wait = Histogram("tandem_router_admission_queue_seconds",
                                                "Time a request waited in the admission queue before it started",
                                                RequestLatencyBuckets());
  prometheus::Histogram& ttft_error = Histogram(
      "tandem_router_ttft_prediction_error_ratio",
      "(observed - predicted) / predicted time to first token, for requests the policy predicted",
      ErrorRatioBuckets());
  prometheus::Histogram& tpot_error = Histogram(
      "tandem_router_tpot_prediction_error_ratio",
      "(observed - predicted) / predicted time per output token, for requests the policy predicted",
      ErrorRatioBuckets());
  prometheus::Family<prometheus::Counter>& slo = prometheus::BuildCounter()
      .Name("tandem_router_slo_requests_total")
      .Help("Finished requests with latency objectives by priority class (background < 0, "
            "normal 0, high > 0) and whether both objectives were met")
      .Register(ProcessMetrics());
  prometheus::Family<prometheus::Counter>& migrations = prometheus::BuildCounter()
      .Name("tandem_router_migrations_total")
      .Help("Requests moved to another decode worker after theirs failed or handed them off "
            "while draining, by reason: worker_failed, stream_cancelled, stream_stalled, "
            "worker_draining")
      .Register(ProcessMetrics());
  prometheus::Family<prometheus::Counter>& stalled = prometheus::BuildCounter()
      .Name("tandem_router_stalled_streams_total")
      .Help("Decode streams that sent neither a token nor a heartbeat for the stall timeout, by "
            "what became of their request: migrated (to another decode worker) or failed "
            "(ended with UNAVAILABLE)")
      .Register(ProcessMetrics());
  prometheus::Family<prometheus::Counter>& broken = prometheus::BuildCounter()
      .Name("tandem_router_decode_stream_failures_total")
      .Help("Decode streams that broke before their last token, by cause: keepalive (a ping went "
            "unanswered), stalled (silent past the stall timeout), other")
      .Register(ProcessMetrics());
  prometheus::Histogram& ttft = Histogram("tandem_router_time_to_first_token_seconds",
                                          "From arrival at the router to the first token", RequestLatencyBuckets());
  prometheus::Histogram& itl = Histogram("tandem_router_inter_token_latency_seconds",
                                         "Between consecutive tokens of a stream", TokenLatencyBuckets());
  prometheus::Histogram& e2e = Histogram("tandem_router_e2e_latency_seconds",
                                         "From arrival to the last token", RequestLatencyBuckets());
  prometheus::Histogram& overhead = Histogram(
      "tandem_router_overhead_seconds",
      "The router's own work per request: hashing, placement and starting the relay",
      TokenLatencyBuckets());
  prometheus::Histogram& vllm_ttft = Histogram("vllm:time_to_first_token_seconds",
                                               "Time to first token (vLLM's name)", RequestLatencyBuckets());
  prometheus::Histogram& vllm_e2e = Histogram("vllm:e2e_request_latency_seconds",
                                              "End-to-end request latency (vLLM's name)", RequestLatencyBuckets());
  prometheus::Histogram& vllm_tpot = Histogram("vllm:time_per_output_token_seconds",
                                               "Time per output token (vLLM's name)", TokenLatencyBuckets());

  static prometheus::Histogram::BucketBoundaries ErrorRatioBuckets() {
    return {-0.75, -0.5, -0.3, -0.2, -0.1, -0.05, 0, 0.05, 0.1, 0.2, 0.3, 0.5, 1, 2, 5};
  }
  static prometheus::Histogram& Histogram(const char* name, const char* help,
                                          const prometheus::Histogram::BucketBoundaries& b) {
    return prometheus::BuildHistogram().Name(name).Help(help).Register(ProcessMetrics()).Add({}, b);
  }
};

// The process's RouterMetrics, registered on first use. Thread-safe.
RouterMetrics& Metrics();

}  // namespace tandem::router

#endif  // TANDEM_ROUTER_SERVER_ROUTER_METRICS_H_
