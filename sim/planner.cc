#include "sim/planner.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <functional>
#include <map>
#include <mutex>
#include <thread>
#include <tuple>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/status_macros.h"
#include "nlohmann/json.hpp"
#include "router/placement/placement.h"
#include "sim/simulator.h"

namespace tandem::sim {
namespace {

using placement::Role;

// The pool templates of each role, taken from the base cluster.
struct Templates {
  PoolConfig prefill;
  PoolConfig decode;
  PoolConfig both;
};

Templates TemplatesOf(const ClusterConfig& base) {
  auto first = [&](Role role) -> const PoolConfig* {
    for (const PoolConfig& p : base.pools) {
      if (p.role == role) return &p;
    }
    return nullptr;
  };
  Templates t;
  const PoolConfig* prefill = first(Role::kPrefill);
  const PoolConfig* decode = first(Role::kDecode);
  const PoolConfig* both = first(Role::kBoth);
  t.prefill = prefill != nullptr ? *prefill : base.pools.front();
  t.decode = decode != nullptr ? *decode : both != nullptr ? *both : base.pools.front();
  t.both = both != nullptr ? *both : t.decode;
  t.prefill.role = Role::kPrefill;
  t.decode.role = Role::kDecode;
  t.both.role = Role::kBoth;
  return t;
}

// A search family: everything of a configuration but its pool sizes.
struct Family {
  bool aggregated = false;
  std::string policy;
  int64_t token_budget = 0;  // 0: the templates' own
};

// Runs simulations for the searches, counting them against max_simulations.
class Evaluator {
 public:
  Evaluator(const ClusterConfig& base, std::vector<TraceRequest> trace, const PlanOptions& options)
      : base_(base), templates_(TemplatesOf(base)), trace_(std::move(trace)), options_(options) {}

  // The candidate's attainment on the trace with its arrival times divided by `rate_scale`; nullopt
  // once the simulation bound is reached. Simulation errors come back as errors.
  absl::StatusOr<std::optional<double>> Attainment(const PlanCandidate& c, double rate_scale) {
    if (options_.max_simulations > 0 && count_.fetch_add(1) >= options_.max_simulations) {
      truncated_ = true;
      return std::nullopt;
    }
    if (options_.max_simulations <= 0) count_.fetch_add(1);
    ClusterConfig cluster = base_;
    cluster.policy = c.policy;
    cluster.pools.clear();
    auto add = [&](const PoolConfig& t, int64_t count) {
      if (count <= 0) return;
      PoolConfig p = t;
      p.count = count;
      if (c.token_budget > 0) p.token_budget = c.token_budget;
      cluster.pools.push_back(std::move(p));
    };
    add(templates_.prefill, c.prefill_workers);
    add(templates_.decode, c.decode_workers);
    add(templates_.both, c.both_workers);
    ASSIGN_OR_RETURN(std::unique_ptr<Simulator> sim,
                     Simulator::Create(cluster, {.seed = options_.seed}));
    std::vector<TraceRequest> scaled;
    absl::Span<const TraceRequest> trace = trace_;
    if (rate_scale != 1) {
      scaled = trace_;
      for (TraceRequest& r : scaled) r.arrival_s /= rate_scale;
      trace = scaled;
    }
    ASSIGN_OR_RETURN(std::vector<RequestResult> results, sim->Run(trace));
    return sim::Attainment(trace, results);
  }

  double CostOf(const PlanCandidate& c) const {
    return static_cast<double>(c.prefill_workers) * options_.prefill_cost +
           static_cast<double>(c.decode_workers) * options_.decode_cost +
           static_cast<double>(c.both_workers) * options_.both_cost;
  }

  int64_t simulations() const {
    const int64_t n = count_.load();
    return options_.max_simulations > 0 ? std::min(n, options_.max_simulations) : n;
  }
  bool truncated() const { return truncated_.load(); }
  const PlanOptions& options() const { return options_; }

 private:
  const ClusterConfig& base_;
  const Templates templates_;
  const std::vector<TraceRequest> trace_;
  const PlanOptions& options_;
  std::atomic<int64_t> count_{0};
  std::atomic<bool> truncated_{false};
};

// What one family's search found: its cheapest configuration that meets the target, else the
// largest one tried.
struct FamilyResult {
  PlanCandidate found;
  bool stopped = false;  // the simulation bound ended the search
};

class FamilySearch {
 public:
  FamilySearch(Evaluator* eval, const Family& family) : eval_(eval), family_(family) {}

  absl::StatusOr<FamilyResult> Run() { return family_.aggregated ? Aggregated() : Disaggregated(); }

 private:
  PlanCandidate Make(int64_t prefill, int64_t decode, int64_t both) const {
    PlanCandidate c;
    c.policy = family_.policy;
    c.token_budget = family_.token_budget;
    c.prefill_workers = prefill;
    c.decode_workers = decode;
    c.both_workers = both;
    c.cost = eval_->CostOf(c);
    return c;
  }

  // Evaluates (memoized); false when the simulation bound stopped it.
  absl::StatusOr<bool> Evaluate(PlanCandidate* c) {
    const auto key = std::make_tuple(c->prefill_workers, c->decode_workers, c->both_workers);
    if (auto it = seen_.find(key); it != seen_.end()) {
      *c = it->second;
      return true;
    }
    ASSIGN_OR_RETURN(std::optional<double> a, eval_->Attainment(*c, 1.0));
    if (!a) {
      stopped_ = true;
      return false;
    }
    c->attainment = *a;
    c->meets = *a >= eval_->options().attainment_target;
    seen_.emplace(key, *c);
    return true;
  }

  // The smallest n in [lo, hi] whose candidate make(n) meets the target, by doubling from lo then
  // bisecting; nullopt when none does up to hi (or the bound stopped it). `known_hi`: make(hi) is
  // known to meet, so the doubling is skipped.
  absl::StatusOr<std::optional<PlanCandidate>> Smallest(
      int64_t lo, int64_t hi, const std::function<PlanCandidate(int64_t)>& make,
      PlanCandidate* largest_tried) {
    if (lo > hi) return std::nullopt;
    int64_t fail = lo - 1;  // the largest n known to miss
    int64_t pass = -1;      // the smallest n known to meet
    std::optional<PlanCandidate> met;
    for (int64_t n = lo;;) {
      PlanCandidate c = make(n);
      ASSIGN_OR_RETURN(bool done, Evaluate(&c));
      if (!done) return std::nullopt;
      *largest_tried = c;
      if (c.meets) {
        pass = n;
        met = c;
        break;
      }
      fail = n;
      if (n == hi) return std::nullopt;
      n = std::min(hi, n == 0 ? 1 : 2 * n);
    }
    while (pass - fail > 1) {
      const int64_t mid = fail + (pass - fail) / 2;
      PlanCandidate c = make(mid);
      ASSIGN_OR_RETURN(bool done, Evaluate(&c));
      if (!done) break;
      if (c.meets) {
        pass = mid;
        met = c;
      } else {
        fail = mid;
      }
    }
    return met;
  }

  absl::StatusOr<FamilyResult> Aggregated() {
    PlanCandidate tried;
    ASSIGN_OR_RETURN(
        std::optional<PlanCandidate> met,
        Smallest(
            1, eval_->options().max_workers, [&](int64_t n) { return Make(0, 0, n); }, &tried));
    return FamilyResult{met ? *met : tried, stopped_};
  }

  absl::StatusOr<FamilyResult> Disaggregated() {
    const PlanOptions& o = eval_->options();
    std::optional<PlanCandidate> best;
    PlanCandidate tried = Make(1, 1, 0);
    int64_t previous_decode = -1;  // the smallest decode pool of one prefill worker fewer
    double unmet_attainment = -1;  // the largest tried's attainment at a P that missed
    for (int64_t p = 1; p < o.max_workers && !stopped_; ++p) {
      // No configuration with p prefill workers costs less than p of them and one decode worker.
      if (best && Make(p, 1, 0).cost >= best->cost) break;
      const auto make = [&](int64_t d) { return Make(p, d, 0); };
      std::optional<PlanCandidate> met;
      if (previous_decode > 0) {
        // More prefill should need no more decode: check previous_decode, search below it.
        PlanCandidate at = make(previous_decode);
        ASSIGN_OR_RETURN(bool done, Evaluate(&at));
        if (!done) break;
        if (at.meets) {
          ASSIGN_OR_RETURN(met, Smallest(1, previous_decode - 1, make, &tried));
          if (!met) met = at;
        }
      }
      if (!met && !stopped_) {
        ASSIGN_OR_RETURN(met, Smallest(std::max<int64_t>(1, previous_decode + 1), o.max_workers - p,
                                       make, &tried));
      }
      if (!met) {
        // Prefill-bound at p (or stopped): another prefill worker may help, unless this one did not
        // (the best attainment within max_workers did not grow).
        if (tried.prefill_workers == p && unmet_attainment >= 0 &&
            tried.attainment <= unmet_attainment) {
          break;
        }
        unmet_attainment = tried.attainment;
        continue;
      }
      const bool saved = previous_decode < 0 || met->decode_workers < previous_decode;
      if (!best || met->cost < best->cost ||
          (met->cost == best->cost && met->attainment > best->attainment)) {
        best = met;
      }
      // Another prefill worker that saved no decode worker: decode is what binds.
      if (!saved) break;
      previous_decode = met->decode_workers;
    }
    return FamilyResult{best ? *best : tried, stopped_};
  }

  Evaluator* eval_;
  Family family_;
  bool stopped_ = false;
  std::map<std::tuple<int64_t, int64_t, int64_t>, PlanCandidate> seen_;
};

// Runs tasks[i] for every i on up to `jobs` threads; returns the first error, in task order.
absl::Status RunAll(int32_t jobs, std::vector<std::function<absl::Status()>> tasks) {
  std::vector<absl::Status> status(tasks.size());
  std::atomic<size_t> next{0};
  auto work = [&] {
    for (size_t i; (i = next.fetch_add(1)) < tasks.size();) status[i] = tasks[i]();
  };
  const int32_t threads = std::max<int32_t>(1, std::min<int32_t>(jobs, tasks.size()));
  std::vector<std::thread> pool;
  for (int32_t t = 1; t < threads; ++t) pool.emplace_back(work);
  work();
  for (std::thread& t : pool) t.join();
  for (const absl::Status& s : status) RETURN_IF_ERROR(s);
  return absl::OkStatus();
}

// Cheaper first; then more attainment; then fewer workers; then the label (a total order, so the
// plan does not depend on the order families finished in).
bool Better(const PlanCandidate& a, const PlanCandidate& b) {
  if (a.meets != b.meets) return a.meets;
  if (a.cost != b.cost) return a.cost < b.cost;
  if (a.attainment != b.attainment) return a.attainment > b.attainment;
  if (a.workers() != b.workers()) return a.workers() < b.workers();
  return a.Label() < b.Label();
}

absl::Status Validate(const ClusterConfig& base, absl::Span<const TraceRequest> trace,
                      const PlanOptions& o) {
  auto bad = [](auto&&... parts) { return absl::InvalidArgumentError(absl::StrCat(parts...)); };
  if (base.pools.empty()) return bad("the base cluster has no pools (the workers' templates)");
  if (!base.failures.empty()) {
    return bad(
        "the base cluster has failures; a plan resizes pools, so worker "
        "ids would change");
  }
  if (trace.empty()) return bad("the workload has no requests");
  if (!(o.ttft_slo_ms >= 0) || !(o.tpot_slo_ms >= 0))
    return bad("ttft_slo_ms and tpot_slo_ms must be >= 0");
  bool any = o.ttft_slo_ms > 0 || o.tpot_slo_ms > 0;
  for (const TraceRequest& r : trace) any = any || r.ttft_slo_ms || r.tpot_slo_ms;
  if (!any)
    return bad(
        "no objective: give ttft_slo_ms or tpot_slo_ms (or requests "
        "with them)");
  if (!(o.attainment_target > 0 && o.attainment_target <= 1)) {
    return bad("attainment_target must be in (0, 1], not ", o.attainment_target);
  }
  for (double c : {o.prefill_cost, o.decode_cost, o.both_cost}) {
    if (!(c >= 0) || std::isinf(c)) return bad("costs must be finite and >= 0, not ", c);
  }
  if (o.policies.empty()) return bad("policies: give at least one");
  const std::vector<std::string> known = placement::KnownPolicies();
  for (const std::string& p : o.policies) {
    if (p != "prefix" && std::find(known.begin(), known.end(), p) == known.end()) {
      return bad("policies: '", p, "' is not one of ", absl::StrJoin(known, ", "), ", prefix");
    }
  }
  for (int64_t b : o.token_budgets) {
    if (b < 1) return bad("token_budgets must be >= 1, not ", b);
  }
  if (!o.aggregated && !o.disaggregated) return bad("shapes: give at least one");
  if (o.max_workers < 1 || (!o.aggregated && o.max_workers < 2)) {
    return bad("max_workers must be >= 1 (>= 2 for the disaggregated shape), not ", o.max_workers);
  }
  if (!(o.max_rate_scale >= 1) || std::isinf(o.max_rate_scale)) {
    return bad("max_rate_scale must be finite and >= 1, not ", o.max_rate_scale);
  }
  if (o.headroom_steps < 0) return bad("headroom_steps must be >= 0");
  for (double s : o.curve_scales) {
    if (!(s > 0) || std::isinf(s)) return bad("curve_scales must be finite and > 0, not ", s);
  }
  if (o.curves < 0) return bad("curves must be >= 0");
  if (o.max_simulations < 0) return bad("max_simulations must be >= 0");
  if (o.jobs < 1) return bad("jobs must be >= 1, not ", o.jobs);
  return absl::OkStatus();
}

}  // namespace

std::string PlanCandidate::Label() const {
  std::string shape = aggregated() ? absl::StrCat(both_workers, "x both")
                                   : absl::StrCat(prefill_workers, "P+", decode_workers, "D");
  return absl::StrCat(shape, " ", policy,
                      token_budget > 0 ? absl::StrCat(" budget=", token_budget) : "");
}

double Attainment(absl::Span<const TraceRequest> trace, absl::Span<const RequestResult> results) {
  if (trace.empty()) return 0;
  int64_t met = 0;
  for (size_t k = 0; k < trace.size() && k < results.size(); ++k) {
    const RequestResult& r = results[k];
    if (!r.ok) continue;
    const double tpot = r.output_tokens >= 2
                            ? (r.e2e_ms - r.ttft_ms) / static_cast<double>(r.output_tokens - 1)
                            : -1;
    const bool ttft_ok = !trace[k].ttft_slo_ms || r.ttft_ms <= *trace[k].ttft_slo_ms;
    const bool tpot_ok = !trace[k].tpot_slo_ms || tpot < 0 || tpot <= *trace[k].tpot_slo_ms;
    met += ttft_ok && tpot_ok;
  }
  return static_cast<double>(met) / static_cast<double>(trace.size());
}

absl::StatusOr<Plan> PlanCluster(const ClusterConfig& base, absl::Span<const TraceRequest> trace,
                                 const PlanOptions& options) {
  RETURN_IF_ERROR(Validate(base, trace, options));
  std::vector<TraceRequest> work(trace.begin(), trace.end());
  for (TraceRequest& r : work) {
    if (!r.ttft_slo_ms && options.ttft_slo_ms > 0) r.ttft_slo_ms = options.ttft_slo_ms;
    if (!r.tpot_slo_ms && options.tpot_slo_ms > 0) r.tpot_slo_ms = options.tpot_slo_ms;
  }
  Plan plan;
  plan.requests = static_cast<int64_t>(work.size());
  plan.attainment_target = options.attainment_target;
  const double span = work.back().arrival_s - work.front().arrival_s;
  plan.offered_rate = span > 0 ? static_cast<double>(work.size() - 1) / span : 0;
  Evaluator eval(base, std::move(work), options);

  // Every family, searched on its own thread.
  std::vector<Family> families;
  const std::vector<int64_t> budgets =
      options.token_budgets.empty() ? std::vector<int64_t>{0} : options.token_budgets;
  for (bool aggregated : {true, false}) {
    if (aggregated ? !options.aggregated : !options.disaggregated) continue;
    for (const std::string& policy : options.policies) {
      for (int64_t budget : budgets) families.push_back({aggregated, policy, budget});
    }
  }
  std::vector<FamilyResult> found(families.size());
  std::vector<std::function<absl::Status()>> tasks;
  for (size_t i = 0; i < families.size(); ++i) {
    tasks.push_back([&, i]() -> absl::Status {
      ASSIGN_OR_RETURN(found[i], FamilySearch(&eval, families[i]).Run());
      return absl::OkStatus();
    });
  }
  RETURN_IF_ERROR(RunAll(options.jobs, std::move(tasks)));
  for (const FamilyResult& f : found) plan.families.push_back(f.found);
  std::sort(plan.families.begin(), plan.families.end(), Better);

  // The best and the runner-up with their headroom; the top families' curves. The runner-up is the
  // cheapest other family whose pools differ from the best's (another shape or sizes: an
  // alternative to buy), else the next family (the same pools, another policy or budget).
  std::vector<PlanChoice> choices;
  auto choose = [&](const PlanCandidate& c) {
    choices.push_back({.config = c, .margin = c.attainment - options.attainment_target});
  };
  if (!plan.families.empty() && plan.families[0].meets) {
    const PlanCandidate& best = plan.families[0];
    choose(best);
    auto same_pools = [&](const PlanCandidate& c) {
      return c.prefill_workers == best.prefill_workers && c.decode_workers == best.decode_workers &&
             c.both_workers == best.both_workers;
    };
    auto other = std::find_if(plan.families.begin() + 1, plan.families.end(),
                              [&](const PlanCandidate& c) { return c.meets && !same_pools(c); });
    if (other == plan.families.end() && plan.families.size() > 1 && plan.families[1].meets) {
      other = plan.families.begin() + 1;
    }
    if (other != plan.families.end()) choose(*other);
  }
  const size_t curves = options.curve_scales.empty()
                            ? 0
                            : std::min(plan.families.size(), static_cast<size_t>(options.curves));
  plan.curves.resize(curves);
  tasks.clear();
  for (PlanChoice& choice : choices) {
    tasks.push_back([&, rate = plan.offered_rate]() -> absl::Status {
      double lo = 1, hi = options.max_rate_scale;
      if (hi > 1) {
        ASSIGN_OR_RETURN(std::optional<double> a, eval.Attainment(choice.config, hi));
        if (a && *a >= options.attainment_target) {
          lo = hi;
          choice.headroom_capped = true;
        }
      }
      for (int32_t step = 0; step < options.headroom_steps && !choice.headroom_capped; ++step) {
        const double mid = std::sqrt(lo * hi);  // rates span orders of magnitude: bisect logs
        ASSIGN_OR_RETURN(std::optional<double> a, eval.Attainment(choice.config, mid));
        if (!a) break;
        (*a >= options.attainment_target ? lo : hi) = mid;
      }
      choice.headroom_scale = lo;
      choice.headroom_rate = lo * rate;
      return absl::OkStatus();
    });
  }
  for (size_t i = 0; i < curves; ++i) {
    tasks.push_back([&, i]() -> absl::Status {
      PlanCurve& curve = plan.curves[i];
      curve.label = plan.families[i].Label();
      for (double s : options.curve_scales) {
        ASSIGN_OR_RETURN(std::optional<double> a, eval.Attainment(plan.families[i], s));
        if (!a) break;
        curve.rates.push_back(s * plan.offered_rate);
        curve.attainments.push_back(*a);
      }
      return absl::OkStatus();
    });
  }
  RETURN_IF_ERROR(RunAll(options.jobs, std::move(tasks)));
  if (!choices.empty()) plan.best = choices[0];
  if (choices.size() > 1) plan.runner_up = choices[1];
  plan.simulations = eval.simulations();
  plan.truncated = eval.truncated();
  return plan;
}

// ------------------------------------------------------------------------------------------------
// plan.json and the plan's JSON.
// ------------------------------------------------------------------------------------------------

absl::StatusOr<PlanOptions> ParsePlanOptions(absl::string_view text, absl::string_view path) {
  auto bad = [&](absl::string_view key, auto&&... parts) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": ", key, ": ", parts...));
  };
  nlohmann::json j = nlohmann::json::parse(text.begin(), text.end(), nullptr, false);
  if (j.is_discarded() || !j.is_object()) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": not a JSON object"));
  }
  PlanOptions o;
  o.jobs = 1;
  auto number = [&](const nlohmann::json& v, absl::string_view key, double* out) -> absl::Status {
    if (!v.is_number()) return bad(key, "must be a number, not ", v.dump());
    *out = v.get<double>();
    return absl::OkStatus();
  };
  auto integer = [&](const nlohmann::json& v, absl::string_view key, auto* out) -> absl::Status {
    if (!v.is_number_integer()) return bad(key, "must be an integer, not ", v.dump());
    *out = v.get<std::remove_pointer_t<decltype(out)>>();
    return absl::OkStatus();
  };
  for (const auto& [key, v] : j.items()) {
    if (key == "ttft_slo_ms") {
      RETURN_IF_ERROR(number(v, key, &o.ttft_slo_ms));
    } else if (key == "tpot_slo_ms") {
      RETURN_IF_ERROR(number(v, key, &o.tpot_slo_ms));
    } else if (key == "attainment_target") {
      RETURN_IF_ERROR(number(v, key, &o.attainment_target));
    } else if (key == "costs") {
      if (!v.is_object()) return bad(key, "must be an object {prefill, decode, both}");
      for (const auto& [role, c] : v.items()) {
        double* out = role == "prefill"  ? &o.prefill_cost
                      : role == "decode" ? &o.decode_cost
                      : role == "both"   ? &o.both_cost
                                         : nullptr;
        if (out == nullptr) return bad(absl::StrCat(key, ".", role), "unknown role");
        RETURN_IF_ERROR(number(c, absl::StrCat(key, ".", role), out));
      }
    } else if (key == "policies") {
      if (!v.is_array()) return bad(key, "must be an array of policy names");
      o.policies.clear();
      for (const nlohmann::json& p : v) {
        if (!p.is_string()) return bad(key, "must be an array of policy names");
        o.policies.push_back(p.get<std::string>());
      }
    } else if (key == "token_budgets") {
      if (!v.is_array()) return bad(key, "must be an array of integers");
      for (const nlohmann::json& b : v) {
        int64_t n = 0;
        RETURN_IF_ERROR(integer(b, key, &n));
        o.token_budgets.push_back(n);
      }
    } else if (key == "shapes") {
      if (!v.is_array()) return bad(key, "must be an array of \"aggregated\", \"disaggregated\"");
      o.aggregated = o.disaggregated = false;
      for (const nlohmann::json& s : v) {
        if (s == "aggregated") {
          o.aggregated = true;
        } else if (s == "disaggregated") {
          o.disaggregated = true;
        } else {
          return bad(key, s.dump(), " is not \"aggregated\" or \"disaggregated\"");
        }
      }
    } else if (key == "max_workers") {
      RETURN_IF_ERROR(integer(v, key, &o.max_workers));
    } else if (key == "max_rate_scale") {
      RETURN_IF_ERROR(number(v, key, &o.max_rate_scale));
    } else if (key == "headroom_steps") {
      RETURN_IF_ERROR(integer(v, key, &o.headroom_steps));
    } else if (key == "curve_scales") {
      if (!v.is_array()) return bad(key, "must be an array of numbers");
      for (const nlohmann::json& s : v) {
        double x = 0;
        RETURN_IF_ERROR(number(s, key, &x));
        o.curve_scales.push_back(x);
      }
    } else if (key == "curves") {
      RETURN_IF_ERROR(integer(v, key, &o.curves));
    } else if (key == "max_simulations") {
      RETURN_IF_ERROR(integer(v, key, &o.max_simulations));
    } else if (key == "jobs") {
      RETURN_IF_ERROR(integer(v, key, &o.jobs));
    } else {
      return bad(key, "unknown key");
    }
  }
  return o;
}

namespace {

nlohmann::json CandidateJson(const PlanCandidate& c) {
  return {{"label", c.Label()},
          {"shape", c.aggregated() ? "aggregated" : "disaggregated"},
          {"policy", c.policy},
          {"token_budget", c.token_budget > 0 ? nlohmann::json(c.token_budget) : nullptr},
          {"prefill_workers", c.prefill_workers},
          {"decode_workers", c.decode_workers},
          {"both_workers", c.both_workers},
          {"workers", c.workers()},
          {"cost", c.cost},
          {"attainment", c.attainment},
          {"meets", c.meets}};
}

nlohmann::json ChoiceJson(const std::optional<PlanChoice>& c) {
  if (!c) return nullptr;
  nlohmann::json j = CandidateJson(c->config);
  j["margin"] = c->margin;
  j["headroom_scale"] = c->headroom_scale;
  j["headroom_rate"] = c->headroom_rate;
  j["headroom_capped"] = c->headroom_capped;
  return j;
}

}  // namespace

nlohmann::json PlanToJson(const Plan& plan) {
  nlohmann::json families = nlohmann::json::array();
  for (const PlanCandidate& c : plan.families) families.push_back(CandidateJson(c));
  nlohmann::json curves = nlohmann::json::array();
  for (const PlanCurve& c : plan.curves) {
    curves.push_back({{"label", c.label}, {"rates", c.rates}, {"attainments", c.attainments}});
  }
  return {{"offered_rate", plan.offered_rate},
          {"requests", plan.requests},
          {"attainment_target", plan.attainment_target},
          {"best", ChoiceJson(plan.best)},
          {"runner_up", ChoiceJson(plan.runner_up)},
          {"families", families},
          {"curves", curves},
          {"simulations", plan.simulations},
          {"truncated", plan.truncated}};
}

}  // namespace tandem::sim
