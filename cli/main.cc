// `tandem`: the command-line entry point.
//
//   tandem up        start a local cluster (router + prefill + decode workers) on loopback
//   tandem generate  generate text in this process (single-process mode), or on a cluster (--url)
//   tandem apikey    make an API key for the router's --api_keys_file
//   tandem bench     load-test a running cluster or OpenAI-compatible server (bench/tandem_bench)
//   tandem sim       tandem bench's workloads on the simulator (bench/tandem_bench/sim.py)
//   tandem plan      the cheapest cluster meeting an SLO, by simulation (bench/tandem_bench/plan.py)
//   tandem profile   a worker's step profile (profile.json), captured or from a roofline
//   tandem version   print the version, build and accelerators
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "absl/flags/declare.h"
#include "absl/flags/flag.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "engine/model/model_path.h"
#include "cli/apikey.h"
#include "cli/generate.h"
#include "cli/profile.h"
#include "cli/up.h"
#include "common/device.h"
#include "common/flags.h"
#include "common/logging.h"
#include "common/version.h"

ABSL_FLAG(std::string, model, "", "Model file (GGUF); empty uses the default model");
ABSL_FLAG(std::string, models_dir, "", "Folder of downloaded models; empty uses <source>/models");
ABSL_FLAG(std::string, log_level, "info", "debug, info, warning or error");
ABSL_FLAG(std::string, log_format, "text", "text or json (one JSON object per line)");
ABSL_DECLARE_FLAG(std::string, url);  // generate.cc

namespace tandem {
namespace {

constexpr absl::string_view kUsage = R"(tandem: an LLM serving cluster with disaggregated prefill and decode.

usage: tandem <command> [flags]

commands:
  up        start a local cluster (router, prefill and decode workers) on the default model
  generate  generate text from --prompt in this process (--chat for the chat template), or on
            a running cluster with --url=HOST:PORT (its gRPC API, as `tandem up` prints it;
            its API key from TANDEM_API_KEY, OPENAI_API_KEY or --api_key);
            in this process, --json prints token ids and log-probabilities (--logprobs,
            --prompt_logprobs) and --prompt_ids takes the prompt as token ids
  apikey    print a fresh API key for --tenant=NAME [--rps=N] [--concurrency=N] and the line
            of the router's --api_keys_file that lets it in (docs/security.md)
  bench     load-test a running cluster or any OpenAI-compatible server: open-loop arrivals,
            latency percentiles, SLO attainment and goodput, plots (`tandem bench --help`)
  sim       tandem bench's workloads and report on the discrete-event simulator (tandem_sim)
            with workers of a measured or roofline profile (`tandem sim --help`, docs/sim.md)
  plan      the cheapest cluster meeting TTFT/TPOT objectives on a workload: searches pool
            sizes, prefill:decode ratios, policies and token budgets in the simulator
            (`tandem plan --help`, docs/sim.md "Planning")
  profile   write a worker's step profile for `tandem sim`: --worker=HOST:PORT --out=FILE
            fits a running worker's reported steps with the router's step model (TLS flags as
            for the cluster); --roofline derives one from hardware figures and a model's shape
            (`tandem profile --roofline --help`)
  version   print the version, the build and the accelerators this binary can use
  help      print this message)";

// The directory holding this executable, where the other binaries are built too.
std::string SelfDir() {
  char buffer[4096];
  const ssize_t n = ::readlink("/proc/self/exe", buffer, sizeof(buffer) - 1);
  if (n <= 0) return ".";
  std::string path(buffer, static_cast<size_t>(n));
  return path.substr(0, path.rfind('/'));
}

int Version() {
  std::printf("tandem %s (%s build)\n", kVersion, kBuildType);
  std::printf("cuda: %s\n", BuiltWithCuda() ? "built in" : "not built in");
  const auto gpus = ListGpus();
  if (gpus.ok()) {
    for (const GpuInfo& gpu : *gpus) {
      std::printf("gpu %d: %s, %.1f GiB, compute capability %d.%d\n", gpu.index, gpu.name.c_str(),
                  static_cast<double>(gpu.total_memory_bytes) / (1 << 30),
                  gpu.compute_capability_major, gpu.compute_capability_minor);
    }
  } else {
    std::printf("gpus: none (%s)\n", std::string(gpus.status().message()).c_str());
  }
  return 0;
}

int Up() {
  std::printf("tandem %s: starting a local cluster\n", kVersion);
  const auto model = ResolveModelPath(absl::GetFlag(FLAGS_model), absl::GetFlag(FLAGS_models_dir));
  if (!model.ok()) {
    std::fprintf(stderr, "error: %s\n", std::string(model.status().message()).c_str());
    return 1;
  }
  std::printf("model: %s\n", model->c_str());
  std::fflush(stdout);
  return RunUp(*model, SelfDir());
}

// `tandem bench ARGS...` and `tandem sim ARGS...`: the load generator and its simulated twin are
// Python (bench/tandem_bench, docs/bench.md, docs/sim.md); `module` runs in the project's
// environment, with this build's binaries for the clusters (or the simulator) it starts.
int RunPython(const char* module, int argc, char** argv) {
  const std::string python = absl::StrCat(kSourceDir, "/.venv/bin/python");
  if (::access(python.c_str(), X_OK) != 0) {
    std::fprintf(stderr, "error: %s is missing: run scripts/setup.sh first\n", python.c_str());
    return 1;
  }
  std::string path = absl::StrCat(kSourceDir, "/bench");
  if (const char* old = std::getenv("PYTHONPATH"); old != nullptr && *old != '\0') {
    absl::StrAppend(&path, ":", old);
  }
  ::setenv("PYTHONPATH", path.c_str(), 1);
  ::setenv("TANDEM_BIN_DIR", SelfDir().c_str(), 0);
  ::setenv("TANDEM_SOURCE_DIR", kSourceDir, 0);
  std::vector<char*> args = {const_cast<char*>(python.c_str()), const_cast<char*>("-m"),
                             const_cast<char*>(module)};
  for (int i = 2; i < argc; ++i) args.push_back(argv[i]);
  args.push_back(nullptr);
  ::execv(python.c_str(), args.data());
  std::perror("error: cannot run the project's Python");
  return 1;
}

int Main(int argc, char** argv) {
  // Their flags are the Python tools' own, not this binary's.
  if (argc > 1 && absl::string_view(argv[1]) == "bench") {
    return RunPython("tandem_bench", argc, argv);
  }
  if (argc > 1 && absl::string_view(argv[1]) == "sim") {
    return RunPython("tandem_bench.sim", argc, argv);
  }
  if (argc > 1 && absl::string_view(argv[1]) == "plan") {
    return RunPython("tandem_bench.plan", argc, argv);
  }
  if (argc > 1 && absl::string_view(argv[1]) == "profile") {
    for (int i = 2; i < argc; ++i) {
      if (absl::string_view(argv[i]) == "--roofline") {
        return RunPython("tandem_bench.profile", argc, argv);
      }
    }
  }
  std::vector<char*> args = ParseFlagsWithEnvironment(argc, argv, kUsage);
  const auto level = ParseLogSeverity(absl::GetFlag(FLAGS_log_level));
  const auto format = ParseLogFormat(absl::GetFlag(FLAGS_log_format));
  if (!level.ok() || !format.ok()) {
    std::fprintf(stderr, "error: %s\n",
                 std::string((level.ok() ? format.status() : level.status()).message()).c_str());
    return 2;
  }
  SetLogOptions({.min_severity = *level, .format = *format});

  const absl::string_view command = args.size() > 1 ? args[1] : "help";
  if (args.size() > 2) {
    std::fprintf(stderr, "error: unexpected argument '%s'\n%s\n", args[2], kUsage.data());
    return 2;
  }
  if (command == "version" || command == "--version") return Version();
  if (command == "up") return Up();
  if (command == "apikey") return RunApiKey();
  if (command == "profile") return RunProfile();
  if (command == "generate") {
    if (!absl::GetFlag(FLAGS_url).empty()) return RunGenerate("");
    const auto model =
        ResolveModelPath(absl::GetFlag(FLAGS_model), absl::GetFlag(FLAGS_models_dir));
    if (!model.ok()) {
      std::fprintf(stderr, "error: %s\n", std::string(model.status().message()).c_str());
      return 1;
    }
    return RunGenerate(*model);
  }
  if (command == "help") {
    std::printf("%s\n", kUsage.data());
    return 0;
  }
  std::fprintf(stderr, "error: unknown command '%s'\n\n%s\n", std::string(command).c_str(),
               kUsage.data());
  return 2;
}

}  // namespace
}  // namespace tandem

int main(int argc, char** argv) { return tandem::Main(argc, argv); }
