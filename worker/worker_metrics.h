// A worker's Prometheus metrics (docs/metrics.md), fed by its EngineLoop after every step: batch
// and queue sizes, KV blocks, prefix hits, preemptions, step times; with vLLM's names too where
// vLLM has the same gauge, so existing dashboards and autoscalers work.
#ifndef TANDEM_WORKER_WORKER_METRICS_H_
#define TANDEM_WORKER_WORKER_METRICS_H_

#include "engine/runtime/local_engine.h"
#include "prometheus/counter.h"
#include "prometheus/gauge.h"
#include "prometheus/histogram.h"

namespace tandem {

class WorkerMetrics {
 public:
  WorkerMetrics();  // registers in ProcessMetrics()
  // The scheduler's counters after a step (`step` null when no step ran).
  void Update(const SchedulerStats& stats, const StepInfo* step);

 private:
  prometheus::Gauge& running_;
  prometheus::Gauge& waiting_;
  prometheus::Gauge& blocks_free_;
  prometheus::Gauge& blocks_used_;
  prometheus::Gauge& blocks_cached_;
  prometheus::Gauge& cache_usage_;
  prometheus::Counter& prompt_tokens_;
  prometheus::Counter& prefix_hit_tokens_;
  prometheus::Counter& preemptions_;
  prometheus::Counter& generated_tokens_;
  prometheus::Histogram& batch_size_;
  prometheus::Histogram& step_seconds_;
  // vLLM's names.
  prometheus::Gauge& vllm_running_;
  prometheus::Gauge& vllm_waiting_;
  prometheus::Gauge& vllm_cache_usage_;
  prometheus::Counter& vllm_preemptions_;
  prometheus::Counter& vllm_prompt_tokens_;
  SchedulerStats last_;
};

}  // namespace tandem

#endif  // TANDEM_WORKER_WORKER_METRICS_H_
