// tandem_sim: simulates a Tandem cluster on a trace (docs/sim.md).
//
//   tandem_sim --cluster=cluster.json --trace=trace.jsonl --out=results.jsonl [--seed=N]
//              [--summary] [--threads=1]
//   tandem_sim --cluster=cluster.json --synthetic=requests=1000000,rate=20000 [--out=...]
//   tandem_sim --cluster=templates.json --trace=trace.jsonl --plan=plan.json   (sim/planner.h)
//
// Writes one JSON line per request to --out (the per-request records of tandem bench), and prints
// a one-line JSON summary on stdout. Bad input: exit 2 with a message naming the file, the line and
// the field.
#include <sys/resource.h>

#include <chrono>
#include <cstdio>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "common/flags.h"
#include "nlohmann/json.hpp"
#include "sim/planner.h"
#include "sim/sim_config.h"
#include "sim/simulator.h"
#include "sim/synthetic.h"

#ifdef TANDEM_SIM_MIMALLOC
#include <mimalloc.h>
#endif

ABSL_FLAG(std::string, cluster, "", "cluster.json: policy, pools, links, failures");
ABSL_FLAG(std::string, trace, "", "trace.jsonl: one request a line, sorted by arrival_s");
ABSL_FLAG(std::string, synthetic, "",
          "Generate the trace instead: requests=N,rate=R,prompt=P,output=O,prefix_groups=G,"
          "prefix_tokens=T,ttft_slo_ms=X,tpot_slo_ms=Y");
ABSL_FLAG(std::string, out, "", "results.jsonl (one record per request); empty: none written");
ABSL_FLAG(uint64_t, seed, 0, "Seed of the policies' tie-breaks, step noise and --synthetic");
ABSL_FLAG(bool, summary, false,
          "Add latency percentiles and SLO attainment to the summary line");
ABSL_FLAG(int32_t, threads, 1, "Simulation threads; only 1 (run sweeps as parallel processes)");
ABSL_FLAG(std::string, plan, "",
          "plan.json: search pool sizes, policies and token budgets for the cheapest cluster "
          "meeting the objectives (sim/planner.h); --cluster gives the workers' templates. "
          "Prints the plan as one JSON line");
ABSL_FLAG(bool, fast_decode, true,
          "Advance runs of pure decode steps at once (false: every step is an event)");
ABSL_FLAG(bool, large_pages, true,
          "With mimalloc (the build's, when libmimalloc-dev is installed): ask for transparent "
          "huge pages for the heap, which at thousands of workers saves TLB misses");

namespace {

// Exit status for bad input (the contract with tandem bench / tandem sim).
constexpr int kBadInput = 2;

std::string JsonString(const std::string& s) { return nlohmann::json(s).dump(); }
std::string OrNull(const std::string& s) { return s.empty() ? "null" : JsonString(s); }
std::string Number(double v) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%.6f", v);
  return buf;
}

void AppendRecord(const tandem::sim::TraceRequest& r, const tandem::sim::RequestResult& res,
                  std::string* out) {
  const bool first = res.ttft_ms >= 0;
  const bool tpot = res.ok && res.output_tokens >= 2;
  absl::StrAppend(
      out, "{\"id\":", JsonString(r.id), ",\"arrival_s\":", Number(r.arrival_s),
      ",\"ok\":", res.ok ? "true" : "false", ",\"error\":", OrNull(res.error),
      ",\"ttft_ms\":", first ? Number(res.ttft_ms) : "null",
      ",\"tpot_ms\":",
      tpot ? Number((res.e2e_ms - res.ttft_ms) / static_cast<double>(res.output_tokens - 1)) : "null",
      ",\"e2e_ms\":", res.ok ? Number(res.e2e_ms) : "null",
      ",\"output_tokens\":", res.output_tokens, ",\"requested_output_tokens\":", r.output_tokens,
      ",\"prompt_tokens\":", r.prompt_tokens, ",\"cached_tokens\":", res.cached_tokens,
      ",\"cached_prompt_tokens\":", res.cached_tokens);
  absl::StrAppend(out, ",\"slo_class\":", OrNull(r.slo_class), ",\"priority\":", r.priority,
                  ",\"tenant\":", OrNull(r.tenant), ",\"prefix_group\":", OrNull(r.prefix_group),
                  ",\"ttft_slo_ms\":", r.ttft_slo_ms ? Number(*r.ttft_slo_ms) : "null",
                  ",\"tpot_slo_ms\":", r.tpot_slo_ms ? Number(*r.tpot_slo_ms) : "null",
                  ",\"prefill_worker\":", OrNull(res.prefill_worker),
                  ",\"decode_worker\":", OrNull(res.decode_worker),
                  ",\"migrated\":", res.migrated ? "true" : "false",
                  ",\"preemptions\":", res.preemptions, "}\n");
}

int64_t PeakRssBytes() {
  struct rusage usage {};
  getrusage(RUSAGE_SELF, &usage);
  return static_cast<int64_t>(usage.ru_maxrss) * 1024;  // Linux: kilobytes
}

double Percentile(std::vector<double> v, double q) {
  if (v.empty()) return -1;
  std::sort(v.begin(), v.end());
  const double p = (static_cast<double>(v.size()) - 1) * q / 100;
  const size_t lo = static_cast<size_t>(p);
  const size_t hi = std::min(lo + 1, v.size() - 1);
  return v[lo] + (p - static_cast<double>(lo)) * (v[hi] - v[lo]);
}

int Fail(const absl::Status& s) {
  std::fprintf(stderr, "tandem_sim: %s\n", std::string(s.message()).c_str());
  return s.code() == absl::StatusCode::kInvalidArgument || s.code() == absl::StatusCode::kNotFound
             ? kBadInput
             : 1;
}

}  // namespace

int main(int argc, char** argv) {
  tandem::ParseFlagsWithEnvironment(
      argc, argv,
      "tandem_sim: simulates a Tandem cluster on a trace (docs/sim.md).\n"
      "usage: tandem_sim --cluster=cluster.json (--trace=trace.jsonl | --synthetic=...) "
      "[--out=results.jsonl] [--seed=N] [--summary]");
#ifdef TANDEM_SIM_MIMALLOC
  // Before the simulation allocates its state: the segments made from here on are madvised.
  mi_option_set_enabled(mi_option_large_os_pages, absl::GetFlag(FLAGS_large_pages));
  // Freed memory is soon allocated again (sequences come and go): keep it committed for 10 s
  // rather than 25 ms, or each huge page is returned and faulted (zeroed) in again and again.
  mi_option_set(mi_option_decommit_delay, 10'000);
  constexpr const char* kAllocator = "mimalloc";
#else
  constexpr const char* kAllocator = "libc";
#endif
  const auto wall_start = std::chrono::steady_clock::now();
  if (absl::GetFlag(FLAGS_threads) != 1) {
    return Fail(absl::InvalidArgumentError(
        "--threads: only 1 is supported; run a sweep as parallel processes"));
  }
  if (absl::GetFlag(FLAGS_cluster).empty()) {
    return Fail(absl::InvalidArgumentError("--cluster is required"));
  }
  if (absl::GetFlag(FLAGS_trace).empty() == absl::GetFlag(FLAGS_synthetic).empty()) {
    return Fail(absl::InvalidArgumentError("give exactly one of --trace and --synthetic"));
  }
  absl::StatusOr<tandem::sim::ClusterConfig> cluster =
      tandem::sim::ReadClusterFile(absl::GetFlag(FLAGS_cluster));
  if (!cluster.ok()) return Fail(cluster.status());
  std::vector<tandem::sim::TraceRequest> trace;
  if (!absl::GetFlag(FLAGS_trace).empty()) {
    absl::StatusOr<std::vector<tandem::sim::TraceRequest>> read =
        tandem::sim::ReadTraceFile(absl::GetFlag(FLAGS_trace));
    if (!read.ok()) return Fail(read.status());
    trace = *std::move(read);
  } else {
    absl::StatusOr<tandem::sim::SyntheticOptions> o =
        tandem::sim::ParseSynthetic(absl::GetFlag(FLAGS_synthetic));
    if (!o.ok()) return Fail(o.status());
    trace = tandem::sim::MakeSyntheticTrace(*o, absl::GetFlag(FLAGS_seed));
  }
  if (const std::string path = absl::GetFlag(FLAGS_plan); !path.empty()) {
    std::ifstream in(path, std::ios::binary);
    if (!in) return Fail(absl::NotFoundError(absl::StrCat(path, ": cannot read")));
    const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    absl::StatusOr<tandem::sim::PlanOptions> options = tandem::sim::ParsePlanOptions(text, path);
    if (!options.ok()) return Fail(options.status());
    options->seed = absl::GetFlag(FLAGS_seed);
    absl::StatusOr<tandem::sim::Plan> plan = tandem::sim::PlanCluster(*cluster, trace, *options);
    if (!plan.ok()) return Fail(plan.status());
    std::puts(tandem::sim::PlanToJson(*plan).dump().c_str());
    return 0;
  }
  const double load_seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - wall_start).count();

  absl::StatusOr<std::unique_ptr<tandem::sim::Simulator>> sim = tandem::sim::Simulator::Create(
      *cluster, {.seed = absl::GetFlag(FLAGS_seed), .fast_decode = absl::GetFlag(FLAGS_fast_decode)});
  if (!sim.ok()) return Fail(sim.status());
  const auto run_start = std::chrono::steady_clock::now();
  absl::StatusOr<std::vector<tandem::sim::RequestResult>> results = (*sim)->Run(trace);
  if (!results.ok()) return Fail(results.status());
  const double run_seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - run_start).count();

  if (const std::string path = absl::GetFlag(FLAGS_out); !path.empty()) {
    std::ofstream out(path, std::ios::binary | std::ios::trunc);
    if (!out) return Fail(absl::NotFoundError(absl::StrCat(path, ": cannot write")));
    std::string chunk;
    for (size_t k = 0; k < trace.size(); ++k) {
      AppendRecord(trace[k], (*results)[k], &chunk);
      if (chunk.size() > (1 << 20)) {
        out << chunk;
        chunk.clear();
      }
    }
    out << chunk;
    if (!out.flush()) return Fail(absl::InternalError(absl::StrCat(path, ": write failed")));
  }

  const tandem::sim::SimSummary& s = (*sim)->summary();
  const double wall =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - wall_start).count();
  std::string line = absl::StrCat(
      "{\"requests\":", s.requests, ",\"ok\":", s.ok, ",\"failed\":", s.failed,
      ",\"workers\":", s.workers, ",\"simulated_seconds\":", Number(s.simulated_seconds),
      ",\"wall_seconds\":", Number(wall), ",\"load_seconds\":", Number(load_seconds),
      ",\"run_seconds\":", Number(run_seconds), ",\"events\":", s.events, ",\"steps\":", s.steps,
      ",\"step_events\":", s.step_events, ",\"preemptions\":", s.preemptions,
      ",\"migrations\":", s.migrations, ",\"prefill_timeouts\":", s.prefill_timeouts,
      ",\"peak_rss_bytes\":", PeakRssBytes(), ",\"allocator\":\"", kAllocator, "\"");
  if (absl::GetFlag(FLAGS_summary)) {
    std::vector<double> ttft, tpot;
    int64_t met = 0;
    for (size_t k = 0; k < trace.size(); ++k) {
      const tandem::sim::RequestResult& r = (*results)[k];
      if (!r.ok) continue;
      ttft.push_back(r.ttft_ms);
      double t = -1;
      if (r.output_tokens >= 2) {
        t = (r.e2e_ms - r.ttft_ms) / static_cast<double>(r.output_tokens - 1);
        tpot.push_back(t);
      }
      const bool ttft_ok = !trace[k].ttft_slo_ms || r.ttft_ms <= *trace[k].ttft_slo_ms;
      const bool tpot_ok = !trace[k].tpot_slo_ms || t < 0 || t <= *trace[k].tpot_slo_ms;
      met += ttft_ok && tpot_ok;
    }
    absl::StrAppend(&line, ",\"ttft_ms_p50\":", Number(Percentile(ttft, 50)),
                    ",\"ttft_ms_p99\":", Number(Percentile(ttft, 99)),
                    ",\"tpot_ms_p50\":", Number(Percentile(tpot, 50)),
                    ",\"tpot_ms_p99\":", Number(Percentile(tpot, 99)), ",\"slo_attainment\":",
                    Number(trace.empty() ? 0 : static_cast<double>(met) / trace.size()));
  }
  line += "}\n";
  std::fputs(line.c_str(), stdout);
  return 0;
}
