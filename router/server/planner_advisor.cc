#include "router/server/planner_advisor.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/logging.h"
#include "common/metrics.h"
#include "prometheus/counter.h"
#include "prometheus/gauge.h"
#include "sim/simulator.h"
#include "sim/synthetic.h"

namespace tandem::router {
namespace {

struct PlannerMetrics {
  prometheus::Family<prometheus::Gauge>& workers =
      prometheus::BuildGauge()
          .Name("tandem_router_planner_recommended_workers")
          .Help(
              "Workers of each role (prefill, decode, both) in the "
              "configuration the planner "
              "recommends for the observed traffic (--planner=advise)")
          .Register(ProcessMetrics());
  prometheus::Family<prometheus::Gauge>& info =
      prometheus::BuildGauge()
          .Name("tandem_router_planner_recommended_info")
          .Help(
              "1 for the recommended configuration, by its label (\"1P+3D "
              "slo\", \"4x both "
              "kv_aware budget=512\"; \"none\": nothing within the worker "
              "bound meets the target)")
          .Register(ProcessMetrics());
  prometheus::Gauge& cost =
      Gauge("tandem_router_planner_recommended_cost",
            "Cost of the recommended configuration (workers, or per-role costs)");
  prometheus::Gauge& margin =
      Gauge("tandem_router_planner_margin_ratio",
            "Simulated SLO attainment of the recommended configuration minus "
            "the attainment target");
  prometheus::Gauge& headroom =
      Gauge("tandem_router_planner_rate_headroom_ratio",
            "Highest multiple of the observed arrival rate the recommended "
            "configuration still serves "
            "within the target (simulated)");
  prometheus::Gauge& rate = Gauge("tandem_router_planner_workload_requests_per_second",
                                  "Arrival rate the last advice planned for (the observed one)");
  prometheus::Gauge& observed =
      Gauge("tandem_router_planner_observed_attainment_ratio",
            "SLO attainment of the requests finished in the planner's window "
            "(-1: none had objectives)");
  prometheus::Gauge& current =
      Gauge("tandem_router_planner_current_attainment_ratio",
            "Simulated SLO attainment of the current workers on the planned "
            "workload");
  prometheus::Family<prometheus::Counter>& runs =
      prometheus::BuildCounter()
          .Name("tandem_router_planner_runs_total")
          .Help(
              "Advices by outcome: planned (a configuration meets the "
              "target), infeasible (none "
              "within the worker bound does), skipped (no traffic or no "
              "worker profile), error")
          .Register(ProcessMetrics());

  static prometheus::Gauge& Gauge(const char* name, const char* help) {
    return prometheus::BuildGauge().Name(name).Help(help).Register(ProcessMetrics()).Add({});
  }
};

PlannerMetrics& Metrics() {
  static PlannerMetrics* metrics = new PlannerMetrics();
  return *metrics;
}

placement::Role RoleOf(v1::WorkerRole role) {
  return role == v1::ROLE_PREFILL ? placement::Role::kPrefill
         : role == v1::ROLE_BOTH  ? placement::Role::kBoth
                                  : placement::Role::kDecode;
}

}  // namespace

ObservedWorkload::ObservedWorkload(absl::Duration window, Clock* clock)
    : window_(window), clock_(clock) {}

void ObservedWorkload::TrimLocked(absl::Time now) {
  while (!arrivals_.empty() && arrivals_.front() < now - window_) arrivals_.pop_front();
  while (!finished_.empty() && finished_.front().at < now - window_) finished_.pop_front();
}

void ObservedWorkload::Arrived() {
  const absl::Time now = clock_->Now();
  absl::MutexLock lock(&mu_);
  arrivals_.push_back(now);
  TrimLocked(now);
}

void ObservedWorkload::Finished(int64_t prompt_tokens, int64_t output_tokens, double ttft_slo_s,
                                double tpot_slo_s, bool met) {
  const absl::Time now = clock_->Now();
  absl::MutexLock lock(&mu_);
  finished_.push_back({now, prompt_tokens, output_tokens, ttft_slo_s, tpot_slo_s, met});
  TrimLocked(now);
}

WorkloadSnapshot ObservedWorkload::Snapshot() {
  const absl::Time now = clock_->Now();
  absl::MutexLock lock(&mu_);
  TrimLocked(now);
  WorkloadSnapshot s;
  s.arrivals = static_cast<int64_t>(arrivals_.size());
  if (arrivals_.size() >= 2) {
    // Gaps between the arrivals seen: the rate while traffic came, not diluted by a quiet start.
    const double span = absl::ToDoubleSeconds(arrivals_.back() - arrivals_.front());
    if (span > 0) s.rate = static_cast<double>(arrivals_.size() - 1) / span;
  }
  s.finished = static_cast<int64_t>(finished_.size());
  double prompt = 0, output = 0, ttft = 0, tpot = 0;
  int64_t with_ttft = 0, with_tpot = 0, met = 0;
  for (const Done& d : finished_) {
    prompt += static_cast<double>(d.prompt_tokens);
    output += static_cast<double>(d.output_tokens);
    if (d.ttft_slo_s > 0) {
      ttft += d.ttft_slo_s;
      ++with_ttft;
    }
    if (d.tpot_slo_s > 0) {
      tpot += d.tpot_slo_s;
      ++with_tpot;
    }
    if (d.ttft_slo_s > 0 || d.tpot_slo_s > 0) {
      ++s.slo_requests;
      met += d.met;
    }
  }
  if (s.finished > 0) {
    s.mean_prompt_tokens = prompt / static_cast<double>(s.finished);
    s.mean_output_tokens = output / static_cast<double>(s.finished);
  }
  if (with_ttft > 0) s.ttft_slo_ms = 1e3 * ttft / static_cast<double>(with_ttft);
  if (with_tpot > 0) s.tpot_slo_ms = 1e3 * tpot / static_cast<double>(with_tpot);
  if (s.slo_requests > 0)
    s.attainment = static_cast<double>(met) / static_cast<double>(s.slo_requests);
  return s;
}

namespace {
std::atomic<ObservedWorkload*> router_workload{nullptr};
}  // namespace

ObservedWorkload* RouterWorkload() { return router_workload.load(std::memory_order_acquire); }

void InstallRouterWorkload(ObservedWorkload* workload) {
  router_workload.store(workload, std::memory_order_release);
}

PlannerAdvisor::PlannerAdvisor(PlannerAdvisorOptions options, Registry* registry,
                               ObservedWorkload* workload)
    : options_(std::move(options)), registry_(registry), workload_(workload) {}

PlannerAdvisor::~PlannerAdvisor() { thread_.reset(); }

void PlannerAdvisor::Start() {
  thread_ = std::make_unique<PeriodicThread>(PeriodicThread::Options{.period = options_.interval},
                                             [this] {
                                               absl::StatusOr<Advice> advice = AdviseOnce();
                                               if (!advice.ok()) {
                                                 LOG(WARNING) << "planner: " << advice.status();
                                               }
                                             });
}

absl::StatusOr<Advice> PlannerAdvisor::AdviseOnce() {
  absl::MutexLock lock(&mu_);
  PlannerMetrics& m = Metrics();
  Advice advice;
  advice.workload = workload_->Snapshot();
  const WorkloadSnapshot& w = advice.workload;
  m.observed.Set(w.attainment);
  auto skip = [&](std::string why) {
    m.runs.Add({{"outcome", "skipped"}}).Increment();
    advice.skipped = std::move(why);
    return advice;
  };
  if (w.rate <= 0 || w.finished == 0) return skip("no traffic in the window");

  // Each role's template: the first ready worker of the role, as the registry knows it.
  sim::ClusterConfig cluster;
  cluster.policy = options_.policies.front();
  int64_t counts[3] = {0, 0, 0};
  for (const WorkerSummary& worker : registry_->Workers()) {
    if (!worker.ready || worker.role == v1::ROLE_UNSPECIFIED) continue;
    const placement::Role role = RoleOf(worker.role);
    if (counts[static_cast<int>(role)]++ > 0) continue;
    std::optional<placement::StepProfile> profile = registry_->CostProfile(worker.worker_id);
    if (!profile) continue;
    sim::PoolConfig pool;
    pool.role = role;
    pool.step = *profile;
    pool.max_running = options_.max_running;
    pool.token_budget = options_.token_budget;
    if (const int64_t blocks = worker.load.free_blocks + worker.load.used_blocks; blocks > 0) {
      pool.kv_blocks = blocks;
    }
    if (const std::optional<Registry::ModelInfo> model = registry_->Model()) {
      pool.block_size = model->block_size;
    }
    cluster.pools.push_back(pool);
  }
  const bool decodes = std::any_of(cluster.pools.begin(), cluster.pools.end(), [](const auto& p) {
    return p.role != placement::Role::kPrefill;
  });
  if (!decodes) return skip("no ready decode-capable worker with a step profile");

  sim::SyntheticOptions synthetic;
  synthetic.requests = options_.trace_requests;
  synthetic.rate = w.rate;
  synthetic.prompt = std::max<int64_t>(1, static_cast<int64_t>(w.mean_prompt_tokens + 0.5));
  synthetic.output = std::max<int64_t>(1, static_cast<int64_t>(w.mean_output_tokens + 0.5));
  synthetic.ttft_slo_ms = w.ttft_slo_ms > 0 ? w.ttft_slo_ms : options_.default_ttft_slo_ms;
  synthetic.tpot_slo_ms = w.tpot_slo_ms > 0 ? w.tpot_slo_ms : options_.default_tpot_slo_ms;
  const std::vector<sim::TraceRequest> trace = sim::MakeSyntheticTrace(synthetic, options_.seed);
  m.rate.Set(w.rate);

  // The current workers on the same workload.
  {
    sim::ClusterConfig current = cluster;
    for (sim::PoolConfig& pool : current.pools) pool.count = counts[static_cast<int>(pool.role)];
    absl::StatusOr<std::unique_ptr<sim::Simulator>> s =
        sim::Simulator::Create(current, {.seed = options_.seed});
    if (s.ok()) {
      absl::StatusOr<std::vector<sim::RequestResult>> r = (*s)->Run(trace);
      if (r.ok()) m.current.Set(sim::Attainment(trace, *r));
    }
  }

  sim::PlanOptions plan_options;
  plan_options.attainment_target = options_.attainment_target;
  plan_options.policies = options_.policies;
  plan_options.max_workers = options_.max_workers;
  plan_options.max_simulations = options_.max_simulations;
  plan_options.headroom_steps = 4;
  plan_options.seed = options_.seed;
  absl::StatusOr<sim::Plan> plan = sim::PlanCluster(cluster, trace, plan_options);
  if (!plan.ok()) {
    m.runs.Add({{"outcome", "error"}}).Increment();
    return plan.status();
  }
  advice.plan = *std::move(plan);
  const std::optional<sim::PlanChoice>& best = advice.plan->best;
  m.runs.Add({{"outcome", best ? "planned" : "infeasible"}}).Increment();
  const std::string label = best ? best->config.Label() : "none";
  if (best) {
    const sim::PlanCandidate& c = best->config;
    m.workers.Add({{"role", "prefill"}}).Set(static_cast<double>(c.prefill_workers));
    m.workers.Add({{"role", "decode"}}).Set(static_cast<double>(c.decode_workers));
    m.workers.Add({{"role", "both"}}).Set(static_cast<double>(c.both_workers));
    m.cost.Set(c.cost);
    m.margin.Set(best->margin);
    m.headroom.Set(best->headroom_scale);
  }
  if (label != last_label_) {
    if (!last_label_.empty()) {
      // The info series of the previous recommendation goes; the new one is the only 1.
      m.info.Remove(&m.info.Add({{"label", last_label_}}));
    }
    m.info.Add({{"label", label}}).Set(1);
    LOG(INFO) << "planner: recommends " << label
              << (best ? absl::StrCat(" (cost ", best->config.cost, ", simulated attainment ",
                                      best->config.attainment, ", margin ", best->margin,
                                      ", rate headroom ", best->headroom_scale, "x)")
                       : std::string(" (nothing within the worker bound meets the target)"))
              << " for " << w.rate << " req/s of ~" << synthetic.prompt << "+" << synthetic.output
              << " tokens, objectives TTFT " << synthetic.ttft_slo_ms << " ms / TPOT "
              << synthetic.tpot_slo_ms << " ms; observed attainment " << w.attainment;
    last_label_ = label;
  }
  return advice;
}

}  // namespace tandem::router
