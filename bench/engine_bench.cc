// engine_bench: end-to-end speed of LocalEngine on one GGUF model, next to llama.cpp on the same
// file with the same thread count.
//
//   build/release/bin/engine_bench [--threads=2] [--repetitions=5] [--model=PATH]
//                                  [--llama_bench=PATH|none] [--llama_batched_bench=PATH|none]
//                                  [--rows=prefill128,decode8,...] [--decode_steps=64]
// Figures, the machine and what is below target: docs/performance.md.
//
// Rows (every figure is the median of --repetitions runs, after one warm-up run):
//   prefill 128 / 512   one sequence; prompt tokens / prefill time (random token ids)
//   decode batch B      B sequences of a 128-token prompt, then --decode_steps greedy steps with
//                       ignore_eos; aggregate generated tokens / decode time
//   peak RSS            VmHWM of this process after the rows above, against the budget
//                       model file + KV pool + 100 MB
//   serve N             continuous batching: N requests of 128 random tokens queued at once, 64
//                       greedy tokens each; output tokens / wall time of the whole run. Also
//                       printed: scheduler time per step at 64 sequences (share of the step and
//                       us per sequence) and the unfilled KV slots held per running sequence
//   ttft                time to first token of a 512-token prefix + 16 new tokens, prefix not
//                       cached vs cached (the same prefix sent just before)
// llama.cpp's figures come from `llama-bench -p 128,512 -n 0` (prefill), `llama-bench -p 0 -n
// <steps>` (decode at batch 1) and `llama-batched-bench -npp 128 -ntg <steps> -npl 8,32` (decode
// at batch 8 and 32; its S_TG column), and for the serve rows `llama-batched-bench -npp 128 -ntg 64
// -npl 1,8,32,64` (pl*tg/t: all of a lockstep batch's output over its whole time). bench/build_llama_cpp.sh builds both tools into
// ~/.cache/tandem/llama.cpp/<version>/build/bin, where this program looks for them by default.
#include <sys/wait.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "engine/model/model_path.h"
#include "common/flags.h"
#include "engine/runtime/local_engine.h"
#include "nlohmann/json.hpp"

ABSL_FLAG(std::string, model, "", "Model file (GGUF); empty: the default model");
ABSL_FLAG(int32_t, threads, 2, "Kernel threads, the calling thread included (also llama.cpp's -t)");
ABSL_FLAG(int32_t, repetitions, 5, "Runs per row; the table shows medians");
ABSL_FLAG(int32_t, decode_steps, 64, "Decode steps per decode row (llama.cpp's -n / -ntg)");
ABSL_FLAG(int32_t, decode_prompt, 128, "Prompt tokens per sequence before decoding");
ABSL_FLAG(std::string, rows, "",
          "Comma-separated rows to run (prefill128, prefill512, decode1, decode8, decode32, "
          "serve1, serve8, serve32, serve64, ttft); empty: all");
ABSL_FLAG(std::string, llama_bench, "",
          "llama-bench binary; empty: look in ~/.cache/tandem/llama.cpp and PATH; none: skip");
ABSL_FLAG(std::string, llama_batched_bench, "",
          "llama-batched-bench binary; empty: next to llama-bench; none: skip");

namespace tandem {
namespace {

constexpr const char* kLlamaCppVersion = "0.3.36";  // bench/build_llama_cpp.sh's sdist
constexpr int64_t kPrefillLengths[] = {128, 512};
constexpr int64_t kDecodeBatches[] = {1, 8, 32};
constexpr int64_t kBlockSize = 16;
constexpr int64_t kMiB = 1 << 20;

double Median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 == 1 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

// One line of the table: Tandem's samples and, when llama.cpp ran, its samples.
struct Row {
  std::string key;   // --rows name: prefill128, decode8, ...
  std::string name;
  std::vector<double> tandem;  // tokens/s per repetition
  std::vector<double> peer;    // llama.cpp tokens/s per repetition (empty: no figure)
  std::string peer_note;       // why there is no peer figure, or where it came from
};

std::vector<int32_t> RandomPrompt(int64_t length, int64_t vocab_size, std::mt19937& rng) {
  std::uniform_int_distribution<int32_t> id(0, static_cast<int32_t>(vocab_size - 1));
  std::vector<int32_t> prompt(static_cast<size_t>(length));
  for (int32_t& t : prompt) t = id(rng);
  return prompt;
}

// A request of `prompt_len` random tokens for exactly `max_tokens` greedy tokens.
GenerationRequest RandomRequest(const LocalEngine& engine, int64_t prompt_len, int64_t max_tokens,
                                std::mt19937& rng) {
  GenerationRequest r;
  r.prompt = RandomPrompt(prompt_len, engine.config().vocab_size, rng);
  r.sampling.temperature = 0.0f;
  r.sampling.ignore_eos = true;
  r.sampling.max_tokens = max_tokens;
  return r;
}

// Runs `batch` sequences of `prompt_len` random tokens for `max_tokens` greedy tokens each.
absl::StatusOr<GenerationStats> RunOnce(LocalEngine& engine, int64_t batch, int64_t prompt_len,
                                        int64_t max_tokens, std::mt19937& rng) {
  std::vector<GenerationRequest> requests;
  for (int64_t b = 0; b < batch; ++b) {
    requests.push_back(RandomRequest(engine, prompt_len, max_tokens, rng));
  }
  GenerationStats stats;
  absl::Status s = engine.Generate(requests, [](const GenerationDelta&) {}, &stats);
  if (!s.ok()) return s;
  return stats;
}

// A "<field>:\t<n> kB" line of /proc/self/status in bytes (VmHWM: peak RSS; RssAnon, RssFile:
// the resident set's anonymous and file-mapped parts now), -1 when absent. The kernel pads <n> to
// 8 characters with spaces, so from 10^7 kB (9.5 GiB) on only the tab separates it.
int64_t ProcStatusBytes(absl::string_view field) {
  std::ifstream status("/proc/self/status");
  std::string line;
  while (std::getline(status, line)) {
    if (absl::StartsWith(line, absl::StrCat(field, ":"))) {
      int64_t kb = 0;
      std::vector<std::string> parts =
          absl::StrSplit(line, absl::ByAnyChar(" \t"), absl::SkipEmpty());
      if (parts.size() >= 2 && absl::SimpleAtoi(parts[1], &kb)) return kb * 1024;
    }
  }
  return -1;
}

// Runs `command` through the shell; its stdout, or an error with the exit status.
absl::StatusOr<std::string> RunCommand(const std::string& command) {
  std::fprintf(stderr, "+ %s\n", command.c_str());
  FILE* pipe = ::popen(command.c_str(), "r");
  if (pipe == nullptr) return absl::InternalError(absl::StrCat("cannot run: ", command));
  std::string out;
  char buf[4096];
  size_t n;
  while ((n = std::fread(buf, 1, sizeof(buf), pipe)) > 0) out.append(buf, n);
  const int status = ::pclose(pipe);
  if (status != 0) {
    return absl::InternalError(absl::StrCat("`", command, "` exited with status ",
                                            WIFEXITED(status) ? WEXITSTATUS(status) : status));
  }
  return out;
}

std::string Quote(const std::string& s) {
  std::string out = "'";
  for (char c : s) out += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return out + "'";
}

bool IsExecutable(const std::string& path) {
  std::error_code ec;
  return !path.empty() && std::filesystem::is_regular_file(path, ec) &&
         (std::filesystem::status(path, ec).permissions() & std::filesystem::perms::owner_exec) !=
             std::filesystem::perms::none;
}

// The llama.cpp tool `name`: `flag_value` when set ("none" disables it), else the build cache of
// bench/build_llama_cpp.sh, else `fallback_dir`, else PATH. Empty when not found.
std::string FindTool(const std::string& flag_value, const std::string& name,
                     const std::string& fallback_dir) {
  if (flag_value == "none") return "";
  if (!flag_value.empty()) return flag_value;
  std::vector<std::string> candidates;
  if (!fallback_dir.empty()) candidates.push_back(absl::StrCat(fallback_dir, "/", name));
  const char* home = std::getenv("HOME");
  const char* cache = std::getenv("TANDEM_CACHE");
  const std::string cache_root =
      cache != nullptr ? cache : absl::StrCat(home != nullptr ? home : "", "/.cache/tandem");
  candidates.push_back(
      absl::StrCat(cache_root, "/llama.cpp/", kLlamaCppVersion, "/build/bin/", name));
  if (const char* path = std::getenv("PATH"); path != nullptr) {
    for (absl::string_view dir : absl::StrSplit(path, ':', absl::SkipEmpty())) {
      candidates.push_back(absl::StrCat(dir, "/", name));
    }
  }
  for (const std::string& c : candidates) {
    if (IsExecutable(c)) return c;
  }
  return "";
}

// llama-bench's JSON: one object per test with n_prompt, n_gen and samples_ts. Returns
// {n_prompt, n_gen} -> tokens/s samples.
absl::StatusOr<std::map<std::pair<int64_t, int64_t>, std::vector<double>>> RunLlamaBench(
    const std::string& tool, const std::string& model, int threads, int reps,
    const std::string& p, const std::string& n) {
  const std::string command =
      absl::StrCat(Quote(tool), " -m ", Quote(model), " -t ", threads, " -r ", reps, " -p ", p,
                   " -n ", n, " -o json 2>/dev/null");
  absl::StatusOr<std::string> out = RunCommand(command);
  if (!out.ok()) return out.status();
  const nlohmann::json doc = nlohmann::json::parse(*out, nullptr, /*allow_exceptions=*/false);
  if (!doc.is_array()) {
    return absl::InternalError(absl::StrCat("llama-bench printed no JSON array: ", *out));
  }
  std::map<std::pair<int64_t, int64_t>, std::vector<double>> result;
  for (const nlohmann::json& test : doc) {
    if (!test.contains("n_prompt") || !test.contains("n_gen") || !test.contains("samples_ts")) {
      continue;
    }
    std::vector<double>& samples =
        result[{test["n_prompt"].get<int64_t>(), test["n_gen"].get<int64_t>()}];
    for (const nlohmann::json& v : test["samples_ts"]) samples.push_back(v.get<double>());
  }
  return result;
}

// llama-batched-bench --output-format jsonl, once per repetition. Returns batch -> one JSON row per
// repetition (fields pp, tg, pl, t_tg, speed_tg, t, speed, ...).
absl::StatusOr<std::map<int64_t, std::vector<nlohmann::json>>> RunLlamaBatchedBench(
    const std::string& tool, const std::string& model, int threads, int reps, int64_t prompt,
    int64_t steps, const std::vector<int64_t>& batches) {
  const int64_t max_batch = *std::max_element(batches.begin(), batches.end());
  const std::string command = absl::StrCat(
      Quote(tool), " -m ", Quote(model), " -t ", threads, " -tb ", threads, " -c ",
      max_batch * (prompt + steps), " -npp ", prompt, " -ntg ", steps, " -npl ",
      absl::StrJoin(batches, ","), " --output-format jsonl 2>&1");
  std::map<int64_t, std::vector<nlohmann::json>> result;
  for (int r = 0; r < reps; ++r) {
    absl::StatusOr<std::string> out = RunCommand(command);
    if (!out.ok()) return out.status();
    for (absl::string_view line : absl::StrSplit(*out, '\n')) {
      if (!absl::StartsWith(line, "{") || !absl::StrContains(line, "speed_tg")) continue;
      nlohmann::json row = nlohmann::json::parse(line, nullptr, false);
      if (!row.is_object() || !row.contains("pl")) continue;
      result[row["pl"].get<int64_t>()].push_back(std::move(row));
    }
  }
  if (result.empty()) return absl::InternalError("llama-batched-bench printed no results");
  return result;
}

// Samples of `field` of the rows of llama-batched-bench for batch `pl`.
std::vector<double> BatchedField(const std::map<int64_t, std::vector<nlohmann::json>>& rows,
                                 int64_t pl, const std::function<double(const nlohmann::json&)>& f) {
  std::vector<double> out;
  auto it = rows.find(pl);
  if (it == rows.end()) return out;
  for (const nlohmann::json& row : it->second) out.push_back(f(row));
  return out;
}

// ---------------------------------------------------------------------------------------------
// Serving rows: continuous batching, scheduler cost, prefix reuse.
// ---------------------------------------------------------------------------------------------

struct ServeRun {
  double output_tokens_per_s = 0;
  // Over steps whose batch held every request (the steady state): scheduler time / step time,
  // and scheduler time per sequence.
  std::vector<double> overhead_fraction;
  std::vector<double> overhead_us_per_seq;
  // Over all steps: unfilled slots held per running sequence.
  double max_wasted_per_seq = 0;
  double mean_wasted_per_seq = 0;
};

// `n` requests of `prompt_len` random tokens and `max_tokens` greedy tokens each, all queued at
// once; runs until every one finished.
absl::StatusOr<ServeRun> RunServe(LocalEngine& engine, int64_t n, int64_t prompt_len,
                                  int64_t max_tokens, std::mt19937& rng) {
  int64_t outputs = 0;
  for (int64_t i = 0; i < n; ++i) {
    absl::Status s = engine.Add(static_cast<uint64_t>(i),
                                RandomRequest(engine, prompt_len, max_tokens, rng),
                                [&](const GenerationDelta&) { ++outputs; });
    if (!s.ok()) return s;
  }
  ServeRun run;
  double wasted_sum = 0;
  int64_t wasted_samples = 0;
  const auto start = std::chrono::steady_clock::now();
  while (engine.HasWork()) {
    StepInfo info;
    if (absl::Status s = engine.Step(&info); !s.ok()) return s;
    if (info.batch_size == n && info.prefill_tokens == 0) {
      run.overhead_fraction.push_back(info.schedule_seconds / info.total_seconds);
      run.overhead_us_per_seq.push_back(1e6 * info.schedule_seconds / static_cast<double>(n));
    }
    const SchedulerStats st = engine.scheduler_stats();
    if (st.running > 0) {
      const double per_seq = static_cast<double>(st.wasted_slots) / static_cast<double>(st.running);
      run.max_wasted_per_seq = std::max(run.max_wasted_per_seq, per_seq);
      wasted_sum += per_seq;
      ++wasted_samples;
    }
  }
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  run.output_tokens_per_s = static_cast<double>(outputs) / seconds;
  run.mean_wasted_per_seq = wasted_samples > 0 ? wasted_sum / static_cast<double>(wasted_samples) : 0;
  return run;
}

// Seconds from queuing a request of `prompt` (max_tokens 1) to its first token.
absl::StatusOr<double> TimeToFirstToken(LocalEngine& engine, std::vector<int32_t> prompt) {
  GenerationRequest r;
  r.prompt = std::move(prompt);
  r.sampling.temperature = 0.0f;
  r.sampling.max_tokens = 1;
  bool got = false;
  const auto start = std::chrono::steady_clock::now();
  if (absl::Status s = engine.Add(0, std::move(r), [&](const GenerationDelta&) { got = true; });
      !s.ok()) {
    return s;
  }
  while (!got) {
    if (absl::Status s = engine.Step(); !s.ok()) return s;
  }
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  while (engine.HasWork()) {
    if (absl::Status s = engine.Step(); !s.ok()) return s;
  }
  return seconds;
}

std::string Cell(const std::vector<double>& v, const char* format = "%.1f") {
  if (v.empty()) return "-";
  return absl::StrFormat("%s [%s..%s]", absl::StrFormat(format, Median(v)),
                         absl::StrFormat(format, *std::min_element(v.begin(), v.end())),
                         absl::StrFormat(format, *std::max_element(v.begin(), v.end())));
}

// The table of `rows`: Tandem's and the peer's medians [min..max] and their ratio.
void PrintRows(const std::vector<Row>& rows, const char* tandem, const char* peer) {
  std::printf("| %-15s | %-26s | %-26s | %-7s | %s\n", "row", tandem, peer, "ratio", "peer");
  std::printf("|-----------------|----------------------------|----------------------------|"
              "---------|-----\n");
  for (const Row& row : rows) {
    const std::string ratio =
        row.peer.empty() ? "-" : absl::StrFormat("%.2fx", Median(row.tandem) / Median(row.peer));
    std::printf("| %-15s | %-26s | %-26s | %-7s | %s\n", row.name.c_str(), Cell(row.tandem).c_str(),
                Cell(row.peer).c_str(), ratio.c_str(), row.peer_note.c_str());
  }
}

absl::Status RunServingRows(const std::string& model_path, int threads, int reps,
                            const std::string& batched_bench,
                            const std::function<bool(const std::string&)>& want) {
  constexpr int64_t kServePrompt = 128, kServeOutput = 64, kPrefix = 512, kSuffix = 16;
  const int64_t kConcurrency[] = {1, 8, 32, 64};
  LocalEngine::Options options;
  options.cpu.num_threads = threads;
  options.cpu.block_size = kBlockSize;
  options.scheduler.max_running = 64;
  options.scheduler.max_tokens_per_step = 512;
  options.kv_blocks = 64 * ((kServePrompt + kServeOutput + kBlockSize - 1) / kBlockSize) + 8;
  absl::StatusOr<std::unique_ptr<LocalEngine>> opened = LocalEngine::Open(model_path, options);
  if (!opened.ok()) return opened.status();
  LocalEngine& engine = **opened;
  std::mt19937 rng(77);

  std::vector<Row> rows;
  std::vector<int64_t> served;
  std::vector<double> overhead_64, overhead_us_64, wasted_max, wasted_mean;
  for (int64_t n : kConcurrency) {
    if (!want(absl::StrCat("serve", n))) continue;
    Row row;
    row.key = absl::StrCat("serve", n);
    row.name = absl::StrCat("serve ", n, " conc.");
    for (int r = 0; r < reps; ++r) {
      absl::StatusOr<ServeRun> run = RunServe(engine, n, kServePrompt, kServeOutput, rng);
      if (!run.ok()) return run.status();
      row.tandem.push_back(run->output_tokens_per_s);
      wasted_max.push_back(run->max_wasted_per_seq);
      wasted_mean.push_back(run->mean_wasted_per_seq);
      if (n == 64) {
        overhead_64.push_back(Median(run->overhead_fraction) * 100);
        overhead_us_64.push_back(Median(run->overhead_us_per_seq));
      }
    }
    served.push_back(n);
    rows.push_back(std::move(row));
  }
  std::string peer_status = "no peer: llama-batched-bench not found";
  if (!batched_bench.empty() && !served.empty()) {
    auto batched = RunLlamaBatchedBench(batched_bench, model_path, threads, reps, kServePrompt,
                                        kServeOutput, served);
    if (!batched.ok()) return batched.status();
    for (size_t i = 0; i < rows.size(); ++i) {
      // Output tokens over the whole run (prompts included), as the Tandem figure counts them.
      rows[i].peer = BatchedField(*batched, served[i], [](const nlohmann::json& j) {
        return j["pl"].get<double>() * j["tg"].get<double>() / j["t"].get<double>();
      });
      rows[i].peer_note = "llama-batched-bench pl*tg/t (lockstep batch, all prompts at once)";
    }
    peer_status = absl::StrCat("peer: ", batched_bench);
  }

  std::printf("\nserving (continuous batching): %lld-token random prompts, %lld greedy tokens "
              "each, all queued at once; max_running 64, 512 tokens per step\n%s\n\n",
              static_cast<long long>(kServePrompt), static_cast<long long>(kServeOutput),
              peer_status.c_str());
  PrintRows(rows, "Tandem output tok/s", "llama.cpp output tok/s");
  if (!overhead_64.empty()) {
    std::printf("\nscheduler overhead at 64 sequences (decode steps): %s %% of step time "
                "(target < 2 %%), %s us per sequence per step\n",
                Cell(overhead_64, "%.3f").c_str(), Cell(overhead_us_64, "%.2f").c_str());
  }
  if (!wasted_max.empty()) {
    std::printf("wasted token slots per running sequence: mean %s, max %s (target < %lld, one "
                "block)\n",
                Cell(wasted_mean, "%.2f").c_str(), Cell(wasted_max, "%.2f").c_str(),
                static_cast<long long>(kBlockSize));
  }

  if (want("ttft")) {
    std::vector<double> cold, warm;
    for (int r = 0; r < reps; ++r) {
      const std::vector<int32_t> prefix = RandomPrompt(kPrefix, engine.config().vocab_size, rng);
      for (std::vector<double>* out : {&cold, &warm}) {
        std::vector<int32_t> prompt = prefix;
        for (int32_t t : RandomPrompt(kSuffix, engine.config().vocab_size, rng)) prompt.push_back(t);
        absl::StatusOr<double> ttft = TimeToFirstToken(engine, std::move(prompt));
        if (!ttft.ok()) return ttft.status();
        out->push_back(*ttft * 1e3);
      }
    }
    std::printf("\nTTFT, %lld-token prefix + %lld new tokens: not cached %s ms, prefix cached %s "
                "ms: %.1fx faster (target >= 5x)\n",
                static_cast<long long>(kPrefix), static_cast<long long>(kSuffix),
                Cell(cold).c_str(), Cell(warm, "%.2f").c_str(), Median(cold) / Median(warm));
  }
  return absl::OkStatus();
}

absl::Status Main() {
  const int threads = absl::GetFlag(FLAGS_threads);
  const int reps = std::max(1, absl::GetFlag(FLAGS_repetitions));
  const int64_t steps = absl::GetFlag(FLAGS_decode_steps);
  const int64_t decode_prompt = absl::GetFlag(FLAGS_decode_prompt);
  if (threads <= 0 || steps <= 0 || decode_prompt <= 0) {
    return absl::InvalidArgumentError("--threads, --decode_steps and --decode_prompt must be > 0");
  }
  absl::StatusOr<std::string> model_path = ResolveModelPath(absl::GetFlag(FLAGS_model), "");
  if (!model_path.ok()) return model_path.status();

  // KV pool: enough for the largest row (every sequence's blocks are freed after each run).
  const int64_t max_decode_batch = kDecodeBatches[std::size(kDecodeBatches) - 1];
  const int64_t decode_blocks =
      max_decode_batch * ((decode_prompt + steps + 1 + kBlockSize - 1) / kBlockSize);
  const int64_t prefill_blocks = (kPrefillLengths[1] + 1 + kBlockSize - 1) / kBlockSize;
  LocalEngine::Options options;
  options.cpu.num_threads = threads;
  options.cpu.block_size = kBlockSize;
  options.scheduler.max_running = max_decode_batch;
  options.kv_blocks = std::max(decode_blocks, prefill_blocks);
  absl::StatusOr<std::unique_ptr<LocalEngine>> engine = LocalEngine::Open(*model_path, options);
  if (!engine.ok()) return engine.status();
  LocalEngine& e = **engine;
  const int64_t load_peak_rss = ProcStatusBytes("VmHWM");  // packing's peak, before any step

  std::mt19937 rng(2024);
  std::vector<Row> rows;
  {
    absl::StatusOr<GenerationStats> warm = RunOnce(e, 1, 64, 8, rng);  // page the weights in
    if (!warm.ok()) return warm.status();
  }
  const std::string rows_flag = absl::GetFlag(FLAGS_rows);
  const std::vector<std::string> wanted = absl::StrSplit(rows_flag, ',', absl::SkipEmpty());
  auto want = [&](const std::string& key) {
    return wanted.empty() || std::find(wanted.begin(), wanted.end(), key) != wanted.end();
  };
  for (int64_t len : kPrefillLengths) {
    if (!want(absl::StrCat("prefill", len))) continue;
    Row row;
    row.key = absl::StrCat("prefill", len);
    row.name = absl::StrCat("prefill ", len);
    for (int r = 0; r < reps; ++r) {
      absl::StatusOr<GenerationStats> st = RunOnce(e, 1, len, 1, rng);
      if (!st.ok()) return st.status();
      row.tandem.push_back(static_cast<double>(st->prompt_tokens) / st->prefill_seconds);
    }
    rows.push_back(std::move(row));
  }
  for (int64_t batch : kDecodeBatches) {
    if (!want(absl::StrCat("decode", batch))) continue;
    Row row;
    row.key = absl::StrCat("decode", batch);
    row.name = absl::StrCat("decode batch ", batch);
    for (int r = 0; r < reps; ++r) {
      absl::StatusOr<GenerationStats> st = RunOnce(e, batch, decode_prompt, steps + 1, rng);
      if (!st.ok()) return st.status();
      row.tandem.push_back(static_cast<double>(st->decode_tokens) / st->decode_seconds);
    }
    rows.push_back(std::move(row));
  }
  const int64_t peak_rss = ProcStatusBytes("VmHWM");
  const int64_t model_bytes = static_cast<int64_t>(std::filesystem::file_size(*model_path));
  const int64_t kv_bytes = e.kv_pool_bytes();
  const int64_t budget = model_bytes + kv_bytes + 100 * kMiB;

  // llama.cpp on the same file and thread count.
  const std::string llama_bench = FindTool(absl::GetFlag(FLAGS_llama_bench), "llama-bench", "");
  const std::string batched_bench = FindTool(
      absl::GetFlag(FLAGS_llama_batched_bench), "llama-batched-bench",
      llama_bench.empty() ? "" : std::filesystem::path(llama_bench).parent_path().string());
  std::string peer_status;
  if (llama_bench.empty()) {
    peer_status = "llama-bench not found (run bench/build_llama_cpp.sh or pass --llama_bench)";
  } else if (!rows.empty()) {
    auto prefill = RunLlamaBench(llama_bench, *model_path, threads, reps,
                                 absl::StrJoin(kPrefillLengths, ","), "0");
    auto decode = RunLlamaBench(llama_bench, *model_path, threads, reps, "0", absl::StrCat(steps));
    if (!prefill.ok()) return prefill.status();
    if (!decode.ok()) return decode.status();
    std::optional<std::map<int64_t, std::vector<nlohmann::json>>> batched;
    if (!batched_bench.empty()) {
      auto b = RunLlamaBatchedBench(batched_bench, *model_path, threads, reps, decode_prompt, steps,
                                    {kDecodeBatches[1], kDecodeBatches[2]});
      if (!b.ok()) return b.status();
      batched = *std::move(b);
    }
    for (Row& row : rows) {
      for (int64_t len : kPrefillLengths) {
        if (row.key == absl::StrCat("prefill", len)) {
          row.peer = (*prefill)[{len, 0}];
          row.peer_note = absl::StrCat("llama-bench pp", len);
        }
      }
      if (row.key == "decode1") {
        row.peer = (*decode)[{0, steps}];
        row.peer_note = absl::StrCat("llama-bench tg", steps, " (empty context)");
      }
      for (int64_t batch : {kDecodeBatches[1], kDecodeBatches[2]}) {
        if (row.key != absl::StrCat("decode", batch)) continue;
        if (batched.has_value()) {
          row.peer = BatchedField(*batched, batch, [](const nlohmann::json& j) {
            return j["speed_tg"].get<double>();
          });
          row.peer_note = absl::StrCat("llama-batched-bench S_TG, pp", decode_prompt);
        } else {
          row.peer_note = "no peer: llama-batched-bench not found";
        }
      }
    }
    peer_status = absl::StrCat("llama.cpp: ", llama_bench);
  }

  // The table.
  if (rows.empty()) {
    engine->reset();
    return RunServingRows(*model_path, threads, reps, batched_bench, want);
  }
  std::printf("\nengine_bench: %s\nthreads=%d repetitions=%d (medians; min..max in brackets) "
              "decode: %lld-token prompts, %lld greedy steps\n%s\n\n",
              model_path->c_str(), threads, reps, static_cast<long long>(decode_prompt),
              static_cast<long long>(steps), peer_status.c_str());
  PrintRows(rows, "Tandem tok/s", "llama.cpp tok/s");
  auto find = [&](const std::string& key) -> const Row* {
    for (const Row& row : rows) {
      if (row.key == key) return &row;
    }
    return nullptr;
  };
  const Row* b1 = find("decode1");
  const Row* b8 = find("decode8");
  if (b1 != nullptr && b8 != nullptr) {
    std::printf("\nbatch-8 / batch-1 aggregate decode: %.2fx (target >= 5x)\n",
                Median(b8->tandem) / Median(b1->tandem));
    if (!b8->peer.empty() && !b1->peer.empty()) {
      std::printf("llama.cpp batch-8 / batch-1 (tg%lld): %.2fx\n", static_cast<long long>(steps),
                  Median(b8->peer) / Median(b1->peer));
    }
  }
  std::printf("peak RSS (VmHWM): %.1f MiB; budget = model %.1f + KV pool %.1f + 100 MiB = %.1f "
              "MiB: %s\n",
              static_cast<double>(peak_rss) / kMiB, static_cast<double>(model_bytes) / kMiB,
              static_cast<double>(kv_bytes) / kMiB, static_cast<double>(budget) / kMiB,
              peak_rss < 0 ? "NOT MEASURED" : peak_rss <= budget ? "within" : "OVER");
  std::printf("peak RSS after loading (packed weights made, no step run yet): %.1f MiB; "
              "resident now: anonymous %.1f MiB, file-mapped %.1f MiB\n",
              static_cast<double>(load_peak_rss) / kMiB,
              static_cast<double>(ProcStatusBytes("RssAnon")) / kMiB,
              static_cast<double>(ProcStatusBytes("RssFile")) / kMiB);
  engine->reset();  // the serving rows open an engine of their own
  return RunServingRows(*model_path, threads, reps, batched_bench, want);
}

}  // namespace
}  // namespace tandem

int main(int argc, char** argv) {
  tandem::ParseFlagsWithEnvironment(
      argc, argv,
      "engine_bench: Tandem's prefill / decode tokens/s and peak memory, next to llama.cpp.\n"
      "usage: engine_bench [--threads=2] [--repetitions=5] [--model=PATH] [--llama_bench=PATH]");
  if (absl::Status s = tandem::Main(); !s.ok()) {
    std::fprintf(stderr, "engine_bench: %s\n", s.ToString().c_str());
    return 1;
  }
  return 0;
}
