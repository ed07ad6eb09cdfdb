#include "worker/worker_metrics.h"

#include "common/metrics.h"

namespace tandem {
namespace {

prometheus::Gauge& Gauge(const char* name, const char* help,
                         const prometheus::Labels& labels = {}) {
  return prometheus::BuildGauge().Name(name).Help(help).Register(ProcessMetrics()).Add(labels);
}

prometheus::Counter& Counter(const char* name, const char* help) {
  return prometheus::BuildCounter().Name(name).Help(help).Register(ProcessMetrics()).Add({});
}

prometheus::Histogram& Histogram(const char* name, const char* help,
                                 const prometheus::Histogram::BucketBoundaries& buckets) {
  return prometheus::BuildHistogram().Name(name).Help(help).Register(ProcessMetrics()).Add({}, buckets);
}

void Advance(prometheus::Counter& counter, int64_t before, int64_t now) {
  if (now > before) counter.Increment(static_cast<double>(now - before));
}

}  // namespace

WorkerMetrics::WorkerMetrics()
    : running_(Gauge("tandem_worker_running_sequences",
                     "Sequences in the running batch (remote prefills included)")),
      waiting_(Gauge("tandem_worker_waiting_sequences", "Sequences waiting for the scheduler")),
      blocks_free_(Gauge("tandem_worker_kv_blocks", "KV blocks by state", {{"state", "free"}})),
      blocks_used_(Gauge("tandem_worker_kv_blocks", "KV blocks by state", {{"state", "used"}})),
      blocks_cached_(Gauge("tandem_worker_kv_blocks", "KV blocks by state", {{"state", "cached"}})),
      cache_usage_(Gauge("tandem_worker_kv_usage_ratio",
                         "Share of the KV blocks held by sequences (0..1)")),
      prompt_tokens_(Counter("tandem_worker_prompt_tokens_total",
                             "Prompt tokens of the sequences added")),
      prefix_hit_tokens_(Counter("tandem_worker_prefix_hit_tokens_total",
                                 "Prompt tokens found in the prefix cache at admission")),
      preemptions_(Counter("tandem_worker_preemptions_total",
                           "Sequences preempted for lack of KV blocks (recomputed later)")),
      generated_tokens_(Counter("tandem_worker_step_tokens_total",
                                "Tokens computed by engine steps (prompt and decode)")),
      batch_size_(Histogram("tandem_worker_batch_size", "Sequences per engine step",
                            {1, 2, 4, 8, 16, 32, 64, 128, 256})),
      step_seconds_(Histogram("tandem_worker_step_seconds", "Wall time of one engine step",
                              TokenLatencyBuckets())),
      vllm_running_(Gauge("vllm:num_requests_running", "Running requests (vLLM's name)")),
      vllm_waiting_(Gauge("vllm:num_requests_waiting", "Waiting requests (vLLM's name)")),
      vllm_cache_usage_(Gauge("vllm:gpu_cache_usage_perc",
                              "KV cache usage, 0..1 (vLLM's name; CPU memory here)")),
      vllm_preemptions_(Counter("vllm:num_preemptions_total", "Preemptions (vLLM's name)")),
      vllm_prompt_tokens_(Counter("vllm:prompt_tokens_total", "Prompt tokens (vLLM's name)")) {}

void WorkerMetrics::Update(const SchedulerStats& s, const StepInfo* step) {
  running_.Set(static_cast<double>(s.running + s.remote_prefills));
  waiting_.Set(static_cast<double>(s.waiting));
  blocks_free_.Set(static_cast<double>(s.free_blocks));
  blocks_used_.Set(static_cast<double>(s.used_blocks));
  blocks_cached_.Set(static_cast<double>(s.cached_blocks));
  const double usage =
      s.total_blocks > 0 ? static_cast<double>(s.used_blocks) / static_cast<double>(s.total_blocks)
                         : 0.0;
  cache_usage_.Set(usage);
  vllm_running_.Set(static_cast<double>(s.running + s.remote_prefills));
  vllm_waiting_.Set(static_cast<double>(s.waiting));
  vllm_cache_usage_.Set(usage);
  Advance(prompt_tokens_, last_.prompt_tokens, s.prompt_tokens);
  Advance(vllm_prompt_tokens_, last_.prompt_tokens, s.prompt_tokens);
  Advance(prefix_hit_tokens_, last_.prefix_hit_tokens, s.prefix_hit_tokens);
  Advance(preemptions_, last_.preemptions, s.preemptions);
  Advance(vllm_preemptions_, last_.preemptions, s.preemptions);
  Advance(generated_tokens_, last_.step_tokens, s.step_tokens);
  if (step != nullptr && step->batch_size > 0) {
    batch_size_.Observe(static_cast<double>(step->batch_size));
    step_seconds_.Observe(step->total_seconds);
  }
  last_ = s;
}

}  // namespace tandem
