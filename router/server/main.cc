// tandem-router: the cluster's front door. Serves tandem.v1.Inference over gRPC (with health and
// reflection) and the OpenAI-compatible HTTP API, discovers workers and follows their state, and
// places every request on a decode worker (and its prefill workers) with a placement policy.
//
//   tandem-router --listen=0.0.0.0:7000 --http_listen=0.0.0.0:8000
//                 --workers=10.0.0.5:7100,10.0.0.6:7200 [--policy=kv_aware]
#include <sys/resource.h>

#include <cstdio>

#include "absl/flags/flag.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "engine/model/model_path.h"
#include "common/flags.h"
#include "common/logging.h"
#include "common/serve.h"
#include "common/tls_flags.h"
#include "router/auth/tenant_gate.h"
#include "router/server/http_server.h"
#include "common/https_terminator.h"
#include "router/server/inference_service.h"
#include "router/server/planner_advisor.h"
#include "router/server/registry.h"
#include "router/server/request_router.h"

ABSL_FLAG(std::string, listen, "0.0.0.0:7000", "host:port of the gRPC API (port 0: any)");
ABSL_FLAG(std::string, http_listen, "0.0.0.0:8000",
          "host:port of the OpenAI-compatible HTTP API and /metrics (port 0: any); empty: none");
ABSL_FLAG(std::string, workers, "", "Comma-separated worker addresses (host:port)");
ABSL_FLAG(std::string, workers_dns, "",
          "Comma-separated host:port of DNS names whose addresses are the workers (e.g. one "
          "headless Service per pool); re-resolved every 5 s");
ABSL_FLAG(std::string, policy, "kv_aware",
          "Placement policy: round_robin, least_loaded, kv_aware, slo (docs/slo.md)");
ABSL_FLAG(int64_t, default_ttft_ms, 2000,
          "slo: the time-to-first-token objective of a request that sets none, ms");
ABSL_FLAG(int64_t, default_tpot_ms, 100,
          "slo: the time-per-output-token objective of a request that sets none, ms");
ABSL_FLAG(std::string, step_profile, "",
          "slo: where each worker's step-time model starts before its own timings refine it: "
          "base_ms,prefill_token_ms,decode_token_ms,context_token_us[,prompt_context_token_us] "
          "(the last: per token a prompt token attends to; context_token_us when left out; "
          "empty: the built-in default of docs/slo.md)");
ABSL_FLAG(double, remote_prefill_headroom, 0.5,
          "slo: send a prompt to a prefill worker whenever that predicts a TTFT at least this "
          "fraction of its objective under it; else prefill on the decode worker if better there");
ABSL_FLAG(int64_t, max_queued, 256,
          "slo: requests that may wait in the admission queue at once (0: refuse instead)");
ABSL_FLAG(int64_t, max_queue_ms, 5000, "slo: longest a request waits in the admission queue, ms");
ABSL_FLAG(std::string, priority_classes, "",
          "slo: admission classes by request priority, MIN_PRIORITY:ADMIT_HEADROOM:MAX_QUEUED, "
          "comma-separated and ascending; a request is admitted at once when its predicted "
          "headroom is at least ADMIT_HEADROOM (empty: -1:0.2:32,0:0:128,1:-0.25:128, "
          "docs/slo.md)");

ABSL_FLAG(int64_t, local_prefill_threshold, 256,
          "Prefill on the decode worker when at most this many prompt tokens are not cached there");
ABSL_FLAG(std::string, model, "", "Model file whose tokenizer the router uses; empty: the default");
ABSL_FLAG(std::string, models_dir, "", "Folder of downloaded models; empty: <source>/models");
ABSL_FLAG(int64_t, max_body_bytes, 8 << 20, "Largest HTTP request body accepted");
ABSL_FLAG(int32_t, max_migrations, 2,
          "How many times a request may move to another decode worker after its own failed "
          "mid-stream (0: never; the client then gets the error)");

ABSL_FLAG(int64_t, keepalive_time_ms, 2000,
          "gRPC keepalive of the channels to the workers: idle time after which a ping checks "
          "that a worker still answers, ms");
ABSL_FLAG(int64_t, keepalive_timeout_ms, 2000,
          "gRPC keepalive: how long a ping may go unanswered before the connection is closed "
          "(its streams then move to other decode workers), ms; a cut link is found within "
          "time + timeout");
ABSL_FLAG(int64_t, stream_stall_timeout_ms, 6000,
          "A decode worker that sends neither a token nor a heartbeat on a stream for this long "
          "is taken to have failed for it: the request moves to another decode worker, or ends "
          "with UNAVAILABLE (above the workers' --stream_heartbeat_ms), ms");
ABSL_FLAG(int64_t, drain_timeout_ms, 20000,
          "After SIGTERM or SIGINT: how long the requests in flight may run on before the router "
          "cuts them and exits (it exits as soon as none is left); new requests are refused "
          "meanwhile, and GET /health answers 503. A second signal cuts them at once, ms");
ABSL_FLAG(std::string, api_keys_file, "",
          "API keys per tenant (docs/security.md): one '<tenant> sha256:<hex of the key's "
          "SHA-256> [rps=N] [concurrency=N]' a line, '#' comments; `tandem apikey` makes a key "
          "and its line. Every request then needs 'Authorization: Bearer <key>' (gRPC: the "
          "'authorization' metadata). Re-read when it changes. Empty: no keys needed");
ABSL_FLAG(std::string, auth_open_paths, "/health,/metrics",
          "With --api_keys_file: comma-separated HTTP paths that need no key (empty: none)");
ABSL_FLAG(int64_t, api_keys_reload_ms, 1000,
          "With --api_keys_file: how often the file is checked for changes, ms");
ABSL_FLAG(int64_t, worker_liveness_timeout_ms, 3000,
          "A worker whose WatchState stream brings nothing (load samples come every 100 ms) for "
          "this long takes no requests until it answers again with a fresh snapshot, ms");

ABSL_FLAG(std::string, planner, "off",
          "advise: every --planner_interval_s, plan (sim/planner.h) the cheapest configuration "
          "for the observed traffic and export it (tandem_router_planner_* metrics, an INFO line "
          "when it changes); off: no planner");
ABSL_FLAG(double, planner_interval_s, 30, "planner=advise: seconds between advices");
ABSL_FLAG(double, planner_window_s, 60,
          "planner=advise: the traffic of the last this many seconds is planned for");
ABSL_FLAG(double, planner_attainment_target, 0.9,
          "planner=advise: the fraction of requests that must meet their objectives");
ABSL_FLAG(int64_t, planner_max_workers, 16, "planner=advise: the most workers it recommends");
ABSL_FLAG(int64_t, planner_max_simulations, 200,
          "planner=advise: simulations per advice at most (bounds its time)");

namespace tandem::router {
namespace {

absl::Status Run() {
  // Every streaming client holds a socket: allow as many as the system lets this process have.
  rlimit files{};
  if (getrlimit(RLIMIT_NOFILE, &files) == 0 && files.rlim_cur < files.rlim_max) {
    files.rlim_cur = files.rlim_max;
    setrlimit(RLIMIT_NOFILE, &files);
  }
  // TLS first: a bad file stops the router before it loads anything.
  absl::StatusOr<TlsOptions> tls = TlsOptionsFromFlags();
  if (!tls.ok()) return tls.status();
  absl::StatusOr<ChannelSecurity> channel_security = ChannelSecurityFor(*tls);
  if (!channel_security.ok()) return channel_security.status();
  // The public gRPC API takes any TLS client (API keys say who it is); the channels to the
  // workers present the router's certificate (mutual TLS).
  absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> api_credentials =
      ServerCredentialsFor(*tls, ClientAuth::kAnyClient);
  if (!api_credentials.ok()) return api_credentials.status();
  absl::StatusOr<std::string> model_path =
      ResolveModelPath(absl::GetFlag(FLAGS_model), absl::GetFlag(FLAGS_models_dir));
  if (!model_path.ok()) return model_path.status();
  RegistryOptions registry_options;
  registry_options.addresses =
      absl::StrSplit(absl::GetFlag(FLAGS_workers), ',', absl::SkipWhitespace());
  registry_options.dns_names =
      absl::StrSplit(absl::GetFlag(FLAGS_workers_dns), ',', absl::SkipWhitespace());
  const KeepaliveOptions keepalive{
      .time = absl::Milliseconds(absl::GetFlag(FLAGS_keepalive_time_ms)),
      .timeout = absl::Milliseconds(absl::GetFlag(FLAGS_keepalive_timeout_ms))};
  if (absl::Status s = ValidateKeepalive(keepalive); !s.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("--keepalive_time_ms / --keepalive_timeout_ms: ", s.message()));
  }
  if (absl::GetFlag(FLAGS_drain_timeout_ms) < 0) {
    return absl::InvalidArgumentError("--drain_timeout_ms must be >= 0");
  }
  if (absl::GetFlag(FLAGS_stream_stall_timeout_ms) <= 0 ||
      absl::GetFlag(FLAGS_worker_liveness_timeout_ms) <= 0) {
    return absl::InvalidArgumentError(
        "--stream_stall_timeout_ms and --worker_liveness_timeout_ms must be positive");
  }
  registry_options.keepalive = keepalive;
  registry_options.security = *channel_security;
  registry_options.liveness_timeout =
      absl::Milliseconds(absl::GetFlag(FLAGS_worker_liveness_timeout_ms));
  if (registry_options.addresses.empty() && registry_options.dns_names.empty()) {
    return absl::InvalidArgumentError("give --workers or --workers_dns");
  }
  RouterOptions options;
  if (const std::string profile = absl::GetFlag(FLAGS_step_profile); !profile.empty()) {
    const std::vector<std::string> parts = absl::StrSplit(profile, ',');
    double v[5];
    bool parsed = parts.size() == 4 || parts.size() == 5;
    for (size_t i = 0; parsed && i < parts.size(); ++i) parsed = absl::SimpleAtod(parts[i], &v[i]);
    if (!parsed) {
      return absl::InvalidArgumentError(
          absl::StrCat("--step_profile must be base_ms,prefill_token_ms,decode_token_ms,"
                       "context_token_us[,prompt_context_token_us], got '",
                       profile, "'"));
    }
    if (parts.size() == 4) v[4] = v[3];
    const placement::StepProfile p{.base_seconds = v[0] * 1e-3,
                                   .prefill_token_seconds = v[1] * 1e-3,
                                   .decode_token_seconds = v[2] * 1e-3,
                                   .context_token_seconds = v[3] * 1e-6,
                                   .prompt_context_token_seconds = v[4] * 1e-6};
    if (absl::Status s = placement::ValidateProfile(p); !s.ok()) return s;
    options.policy_options.default_step_profile = p;
    registry_options.cost_model.prior = p;
  }
  Registry registry(registry_options);
  options.model_path = *model_path;
  options.policy = absl::GetFlag(FLAGS_policy);
  options.max_migrations = absl::GetFlag(FLAGS_max_migrations);
  options.keepalive = keepalive;
  options.security = *channel_security;
  options.stream_stall_timeout = absl::Milliseconds(absl::GetFlag(FLAGS_stream_stall_timeout_ms));
  options.policy_options.default_ttft_ms = absl::GetFlag(FLAGS_default_ttft_ms);
  options.policy_options.default_tpot_ms = absl::GetFlag(FLAGS_default_tpot_ms);
  options.policy_options.remote_prefill_headroom = absl::GetFlag(FLAGS_remote_prefill_headroom);
  options.admission.max_queued = absl::GetFlag(FLAGS_max_queued);
  options.admission.max_queue_time = absl::Milliseconds(absl::GetFlag(FLAGS_max_queue_ms));
  absl::StatusOr<std::vector<placement::PriorityClass>> classes =
      placement::ParsePriorityClasses(absl::GetFlag(FLAGS_priority_classes));
  if (!classes.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("--priority_classes: ", classes.status().message()));
  }
  options.admission.classes = *std::move(classes);
  if (options.max_migrations < 0) return absl::InvalidArgumentError("--max_migrations must be >= 0");
  options.policy_options.local_prefill_threshold_tokens =
      absl::GetFlag(FLAGS_local_prefill_threshold);
  absl::StatusOr<std::unique_ptr<RequestRouter>> router = RequestRouter::Create(options, &registry);
  if (!router.ok()) return router.status();
  std::unique_ptr<PlannerAdvisor> advisor;
  if (const std::string planner = absl::GetFlag(FLAGS_planner); planner == "advise") {
    const double interval = absl::GetFlag(FLAGS_planner_interval_s);
    const double window = absl::GetFlag(FLAGS_planner_window_s);
    if (!(interval > 0) || !(window > 0)) {
      return absl::InvalidArgumentError("--planner_interval_s and --planner_window_s must be > 0");
    }
    // Lives as long as the process: the relays' threads may record into it until exit.
    static ObservedWorkload* workload = new ObservedWorkload(absl::Seconds(window));
    InstallRouterWorkload(workload);
    PlannerAdvisorOptions advise;
    advise.interval = absl::Seconds(interval);
    advise.default_ttft_slo_ms = static_cast<double>(options.policy_options.default_ttft_ms);
    advise.default_tpot_slo_ms = static_cast<double>(options.policy_options.default_tpot_ms);
    advise.attainment_target = absl::GetFlag(FLAGS_planner_attainment_target);
    advise.policies = {options.policy};
    advise.max_workers = absl::GetFlag(FLAGS_planner_max_workers);
    advise.max_simulations = absl::GetFlag(FLAGS_planner_max_simulations);
    if (!(advise.attainment_target > 0 && advise.attainment_target <= 1) ||
        advise.max_workers < 1 || advise.max_simulations < 1) {
      return absl::InvalidArgumentError(
          "--planner_attainment_target must be in (0, 1], --planner_max_workers and "
          "--planner_max_simulations >= 1");
    }
    advisor = std::make_unique<PlannerAdvisor>(advise, &registry, workload);
    advisor->Start();
  } else if (planner != "off") {
    return absl::InvalidArgumentError(
        absl::StrCat("--planner must be off or advise, not '", planner, "'"));
  }
  std::unique_ptr<auth::ApiKeyGate> api_keys;
  if (const std::string file = absl::GetFlag(FLAGS_api_keys_file); !file.empty()) {
    if (absl::GetFlag(FLAGS_api_keys_reload_ms) <= 0) {
      return absl::InvalidArgumentError("--api_keys_reload_ms must be positive");
    }
    absl::StatusOr<std::unique_ptr<auth::ApiKeyGate>> gate = auth::ApiKeyGate::Create(
        {.keys_file = file,
         .reload_period = absl::Milliseconds(absl::GetFlag(FLAGS_api_keys_reload_ms)),
         .open_paths = absl::StrSplit(absl::GetFlag(FLAGS_auth_open_paths), ',',
                                      absl::SkipWhitespace())});
    if (!gate.ok()) {
      return absl::InvalidArgumentError(absl::StrCat("--api_keys_file: ", gate.status().message()));
    }
    api_keys = *std::move(gate);
    LOG(INFO) << "API keys from " << file << "; open HTTP paths: '"
              << absl::GetFlag(FLAGS_auth_open_paths) << "'";
  }
  // Destroyed in reverse: the HTTP server stops first (closing its connections), then the TLS
  // terminator relays what they still sent, then its context goes.
  std::unique_ptr<ServerTlsContext> https_context;
  std::unique_ptr<HttpsTerminator> https;
  std::unique_ptr<HttpServer> http;
  int http_port = 0;
  if (!absl::GetFlag(FLAGS_http_listen).empty()) {
    // With TLS the HTTP server listens on loopback and a TLS terminator on --http_listen
    // (common/https_terminator.h). HTTPS, like the gRPC API, takes any client: API keys say
    // who it is.
    const bool with_tls = TlsEnabled(*tls);
    if (with_tls) {
      absl::StatusOr<std::unique_ptr<ServerTlsContext>> context =
          ServerTlsContext::Create(*tls, ClientAuth::kAnyClient);
      if (!context.ok()) return context.status();
      https_context = *std::move(context);
    }
    absl::StatusOr<std::unique_ptr<HttpServer>> started = HttpServer::Start(
        router->get(), {.listen = with_tls ? "127.0.0.1:0" : absl::GetFlag(FLAGS_http_listen),
                        .max_body_bytes = absl::GetFlag(FLAGS_max_body_bytes),
                        .api_keys = api_keys.get()});
    if (!started.ok()) return started.status();
    http = *std::move(started);
    http_port = http->port();
    if (with_tls) {
      absl::StatusOr<std::unique_ptr<HttpsTerminator>> terminator = HttpsTerminator::Start(
          {.listen = absl::GetFlag(FLAGS_http_listen),
           .backend_port = http->port(),
           .tls = https_context.get()});
      if (!terminator.ok()) return terminator.status();
      https = *std::move(terminator);
      http_port = https->port();
    }
  }
  InferenceService inference(router->get(), api_keys.get());
  // The drain (docs/failures.md, "Planned shutdown"): the request router refuses new requests
  // and waits for those in flight, from both frontends; then each frontend for their ends to be
  // written out. After that no call is left but idle connections, which the server's shutdown
  // need not wait for long.
  ServeOptions serve{.keepalive = keepalive,
                     .drainables = {router->get(), &inference},
                     .drain_timeout = absl::Milliseconds(absl::GetFlag(FLAGS_drain_timeout_ms)),
                     .grace = absl::Seconds(1),
                     .credentials = *api_credentials};
  if (http != nullptr) serve.drainables.push_back(http.get());
  return ServeUntilSignal(absl::GetFlag(FLAGS_listen), {&inference}, [&](int port) {
    std::printf("tandem-router listening on port %d (http port %d, policy %s, workers %s)\n", port,
                http_port, absl::GetFlag(FLAGS_policy).c_str(),
                absl::StrJoin(registry_options.addresses, ",").c_str());
    std::fflush(stdout);
  }, serve);
}

}  // namespace
}  // namespace tandem::router

int main(int argc, char** argv) {
  tandem::BlockTerminationSignals();
  tandem::ParseFlagsWithEnvironment(
      argc, argv, "tandem-router: the cluster's router.\nusage: tandem-router --workers=HOST:PORT,...");
  if (absl::Status s = tandem::router::Run(); !s.ok()) {
    std::fprintf(stderr, "tandem-router: %s\n", s.ToString().c_str());
    return 1;
  }
  return 0;
}
