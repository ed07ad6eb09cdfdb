#include "cli/profile.h"

#include <cstdio>
#include <fstream>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "common/tls_flags.h"
#include "grpcpp/create_channel.h"
#include "router/placement/cost_model.h"
#include "router/registry/worker_view.h"
#include "tandem/v1/worker.grpc.pb.h"

ABSL_FLAG(std::string, worker, "",
          "`tandem profile`: the worker's gRPC address (host:port) whose profile to capture");
ABSL_FLAG(std::string, out, "", "`tandem profile`: the profile.json to write");
ABSL_FLAG(double, watch_s, 0,
          "`tandem profile`: also fit the steps the worker reports over this many seconds");

namespace tandem {
namespace {

constexpr char kFormat[] = "tandem-profile-v1";

int Fail(const absl::Status& status) {
  std::fprintf(stderr, "error: %s\n", std::string(status.message()).c_str());
  return status.code() == absl::StatusCode::kInvalidArgument ? 2 : 1;
}

}  // namespace

absl::StatusOr<CapturedProfile> ProfileOfWorker(const v1::Snapshot& snapshot,
                                                absl::Span<const v1::LoadSample> later) {
  absl::StatusOr<placement::StepCostModel> model =
      placement::StepCostModel::Create(placement::CalibrationOptions());
  if (!model.ok()) return model.status();
  int64_t steps = 0;
  auto observe = [&](const v1::LoadSample& sample) -> absl::Status {
    for (const v1::StepTiming& t : sample.recent_steps()) {
      if (t.batch_size() == 0) continue;
      if (absl::Status s = model->Observe(StepObservationOf(t)); !s.ok()) return s;
      ++steps;
    }
    return absl::OkStatus();
  };
  if (absl::Status s = observe(snapshot.load()); !s.ok()) return s;
  for (const v1::LoadSample& sample : later) {
    if (absl::Status s = observe(sample); !s.ok()) return s;
  }
  if (steps < kMinProfileSteps) {
    return absl::FailedPreconditionError(absl::StrCat(
        "worker ", snapshot.worker_id(), " reports ", steps, " engine steps; a profile needs at "
        "least ", kMinProfileSteps, " (start it with calibration, the default, or let it serve "
        "requests and capture with --watch_s)"));
  }
  const placement::StepProfile& p = model->profile();
  const int64_t kv_bytes = KvBytesPerToken(snapshot.kv_pool().layout());
  return CapturedProfile{.profile = nlohmann::json{
      {"format", kFormat},
      {"model", snapshot.model_id()},
      {"engine", snapshot.engine()},
      {"source", "measured"},
      {"step",
       {{"base_seconds", p.base_seconds},
        {"prefill_token_seconds", p.prefill_token_seconds},
        {"decode_token_seconds", p.decode_token_seconds},
        {"context_token_seconds", p.context_token_seconds},
        {"prompt_context_token_seconds", p.prompt_context_token_seconds}}},
      // A worker that exports no KV pool (a prefill worker) does not say: null.
      {"kv_bytes_per_token", kv_bytes > 0 ? nlohmann::json(kv_bytes) : nlohmann::json(nullptr)},
      {"block_size", snapshot.block_size()},
      {"kv_blocks", snapshot.total_blocks()},
      {"max_running", snapshot.max_running()},
      {"token_budget", snapshot.max_tokens_per_step()},
      {"max_prefill_tokens", snapshot.max_prefill_tokens()},
      {"notes", absl::StrCat("captured from worker ", snapshot.worker_id(), " (",
                             v1::WorkerRole_Name(snapshot.role()), ", version ",
                             snapshot.version(), "): ", steps, " engine steps it reported, "
                             "fitted with the router's step model (StepCostModel, "
                             "CalibrationOptions)")}},
      .steps = steps};
}

int RunProfile() {
  std::string target = absl::GetFlag(FLAGS_worker);
  const std::string out = absl::GetFlag(FLAGS_out);
  const double watch_s = absl::GetFlag(FLAGS_watch_s);
  if (target.empty() || out.empty()) {
    return Fail(absl::InvalidArgumentError(
        "`tandem profile` needs --worker=HOST:PORT (a worker's gRPC address) and --out=FILE, or "
        "--roofline (`tandem profile --roofline --help`)"));
  }
  if (absl::StartsWith(target, "http://") || absl::StartsWith(target, "https://") ||
      !absl::StrContains(target, ':')) {
    return Fail(absl::InvalidArgumentError(
        absl::StrCat("--worker must be host:port (the worker's gRPC port), got '", target, "'")));
  }
  if (!(watch_s >= 0) || watch_s > 86400) {
    return Fail(absl::InvalidArgumentError("--watch_s must be in [0, 86400]"));
  }
  absl::StatusOr<TlsOptions> tls = TlsOptionsFromFlags();
  if (!tls.ok()) return Fail(tls.status());
  absl::StatusOr<ChannelSecurity> security = ChannelSecurityFor(*tls);
  if (!security.ok()) return Fail(security.status());
  grpc::ChannelArguments args;
  std::shared_ptr<grpc::ChannelCredentials> credentials = ApplyChannelSecurity(*security, &args);
  auto stub = v1::WorkerState::NewStub(grpc::CreateCustomChannel(target, credentials, args));

  grpc::ClientContext context;
  // The snapshot comes first; without --watch_s, a worker that sends nothing in 30 s is not one.
  context.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(30 + watch_s)));
  v1::WatchStateRequest request;
  request.set_subscriber("tandem-profile");
  request.set_load_interval_ms(100);
  std::unique_ptr<grpc::ClientReader<v1::WorkerStateUpdate>> reader =
      stub->WatchState(&context, request);
  v1::WorkerStateUpdate update;
  std::optional<v1::Snapshot> snapshot;
  std::vector<v1::LoadSample> later;
  absl::Time until = absl::InfinitePast();
  while (reader->Read(&update)) {
    if (update.has_snapshot()) {
      snapshot = update.snapshot();
      until = absl::Now() + absl::Seconds(watch_s);
    } else if (update.has_load() && snapshot.has_value()) {
      later.push_back(update.load());
    }
    if (snapshot.has_value() && absl::Now() >= until) break;
  }
  context.TryCancel();
  const grpc::Status status = reader->Finish();
  if (!snapshot.has_value()) {
    std::fprintf(stderr, "error: no worker state from %s: %s\n", target.c_str(),
                 status.ok() ? "the stream ended first" : status.error_message().c_str());
    return 1;
  }
  absl::StatusOr<CapturedProfile> captured = ProfileOfWorker(*snapshot, later);
  if (!captured.ok()) return Fail(captured.status());
  std::ofstream file(out);
  file << captured->profile.dump(1) << "\n";
  file.close();
  if (!file) {
    std::fprintf(stderr, "error: cannot write %s\n", out.c_str());
    return 1;
  }
  const nlohmann::json& s = captured->profile["step"];
  std::printf("%s: worker %s (%s, %s) from %lld steps: step = %.4g ms + %.4g us/prompt token + "
              "%.4g us/decoding sequence + %.4g ns/decode context token + %.4g ns/prompt context "
              "token\n",
              out.c_str(), snapshot->worker_id().c_str(), snapshot->model_id().c_str(),
              snapshot->engine().c_str(), static_cast<long long>(captured->steps),
              s["base_seconds"].get<double>() * 1e3, s["prefill_token_seconds"].get<double>() * 1e6,
              s["decode_token_seconds"].get<double>() * 1e6,
              s["context_token_seconds"].get<double>() * 1e9,
              s["prompt_context_token_seconds"].get<double>() * 1e9);
  return 0;
}

}  // namespace tandem
