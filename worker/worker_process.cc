// The flags and the start-up of tandem-prefill and tandem-decode (worker_process.h). Every flag
// can also come from its TANDEM_* environment variable.
#include "worker/worker_process.h"

#include <unistd.h>

#include <cstdio>

#include "absl/flags/flag.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "engine/model/model_path.h"
#include "common/status_macros.h"
#include "common/flags.h"
#include "common/logging.h"
#include "common/metrics.h"
#include "common/serve.h"
#include "common/tls_flags.h"
#include "kvtransfer/ucx_transport.h"

ABSL_FLAG(std::string, listen, "0.0.0.0:0", "host:port of the worker's gRPC server (port 0: any)");
ABSL_FLAG(std::string, metrics_listen, "", "host:port of the Prometheus /metrics server; empty: none");
ABSL_FLAG(bool, metrics_tls, false,
          "Serve --metrics_listen over HTTPS only, with --tls_cert/--tls_key (reloaded like them); "
          "no client certificate is asked for: scrape it trusting the cluster CA");
ABSL_FLAG(std::string, model, "", "Model file (GGUF); empty: the default model");
ABSL_FLAG(std::string, models_dir, "", "Folder of downloaded models; empty: <source>/models");
ABSL_FLAG(std::string, worker_id, "",
          "Name of this worker in the cluster; empty: <hostname>:<port>, or <hostname>-<pid> when "
          "the port is chosen at start");
ABSL_FLAG(std::string, ucx_tls, "", "UCX transports for KV transfers (as UCX_TLS); empty: UCX_TLS");
ABSL_FLAG(int32_t, threads, 0, "Kernel threads; 0: all cores");
ABSL_FLAG(int64_t, kv_cache_mb, 512, "Memory for the KV cache, MiB");
ABSL_FLAG(std::string, kv_dtype, "f16",
          "KV cache element type: f16 (half the memory and transfer bytes) or f32; prefill and "
          "decode workers that share KV must agree");
ABSL_FLAG(int64_t, max_running, 64, "Most sequences in one batch");
ABSL_FLAG(int64_t, max_tokens_per_step, 512, "Token budget of one engine step (prefill chunks + decode)");
ABSL_FLAG(int64_t, max_prefill_tokens, 0,
          "Most prompt tokens computed in one step, all prompts together; 0: the step budget. "
          "Bounds a step that computes prompts, and so how long a higher-priority prompt "
          "arriving meanwhile waits");
ABSL_FLAG(int64_t, max_requests, 1024, "Requests held at once (running, waiting); more are refused");
ABSL_FLAG(bool, prefix_caching, true, "Reuse the KV of earlier prompts that share a prefix");
ABSL_FLAG(std::string, model_id, "", "Model id served and hashed into block hashes; empty: the file name");
ABSL_FLAG(int64_t, keepalive_time_ms, 2000,
          "gRPC keepalive: idle time after which a ping checks that a peer (the router, a prefill "
          "worker) still answers, ms; also the shortest ping interval accepted from clients");
ABSL_FLAG(int64_t, keepalive_timeout_ms, 2000,
          "gRPC keepalive: how long a ping may go unanswered before the connection is closed and "
          "its calls fail (a dead peer is found within time + timeout), ms");
ABSL_FLAG(int64_t, drain_timeout_ms, 20000,
          "After SIGTERM (or SIGINT): how long the requests in progress may run before they are "
          "handed off (a decode worker's streams move to another worker with their tokens so "
          "far), ms; meanwhile new requests are refused and the routers told. Keep it below the "
          "orchestrator's grace period (Kubernetes: terminationGracePeriodSeconds). A second "
          "signal hands off at once");
ABSL_FLAG(bool, calibrate, true,
          "Run a few requests of known shapes before serving, so that the router's cost model "
          "(the slo policy) starts from this machine's step times");

namespace tandem {

absl::StatusOr<WorkerFlags> WorkerFlagsFromCommandLine() {
  WorkerFlags f;
  f.listen = absl::GetFlag(FLAGS_listen);
  ASSIGN_OR_RETURN(f.tls, TlsOptionsFromFlags());
  f.metrics_listen = absl::GetFlag(FLAGS_metrics_listen);
  f.metrics_tls = absl::GetFlag(FLAGS_metrics_tls);
  if (f.metrics_tls && f.metrics_listen.empty()) {
    return absl::InvalidArgumentError("--metrics_tls needs --metrics_listen (the port it secures)");
  }
  if (f.metrics_tls && f.tls.cert_file.empty()) {
    return absl::InvalidArgumentError(
        "--metrics_tls needs --tls_cert and --tls_key (the pair the metrics port presents)");
  }
  ASSIGN_OR_RETURN(f.model_path,
                   ResolveModelPath(absl::GetFlag(FLAGS_model), absl::GetFlag(FLAGS_models_dir)));
  f.worker_id = absl::GetFlag(FLAGS_worker_id);
  if (f.worker_id.empty()) {
    char host[256] = {};
    if (gethostname(host, sizeof(host) - 1) != 0) std::snprintf(host, sizeof(host), "localhost");
    const size_t colon = f.listen.rfind(':');
    const std::string port = colon == std::string::npos ? "" : f.listen.substr(colon + 1);
    f.worker_id = port.empty() || port == "0" ? absl::StrCat(host, "-", getpid())
                                              : absl::StrCat(host, ":", port);
  }
  f.ucx_tls = absl::GetFlag(FLAGS_ucx_tls);
  const int64_t kv_mb = absl::GetFlag(FLAGS_kv_cache_mb);
  if (kv_mb <= 0 || absl::GetFlag(FLAGS_threads) < 0) {
    return absl::InvalidArgumentError("--kv_cache_mb must be positive and --threads >= 0");
  }
  if (absl::GetFlag(FLAGS_drain_timeout_ms) < 0) {
    return absl::InvalidArgumentError("--drain_timeout_ms must be >= 0");
  }
  f.drain_timeout = absl::Milliseconds(absl::GetFlag(FLAGS_drain_timeout_ms));
  f.keepalive.time = absl::Milliseconds(absl::GetFlag(FLAGS_keepalive_time_ms));
  f.keepalive.timeout = absl::Milliseconds(absl::GetFlag(FLAGS_keepalive_timeout_ms));
  if (absl::Status s = ValidateKeepalive(f.keepalive); !s.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("--keepalive_time_ms / --keepalive_timeout_ms: ",
                                                   s.message()));
  }
  EngineLoop::Options& o = f.loop;
  o.engine.cpu.num_threads = absl::GetFlag(FLAGS_threads);
  o.engine.kv_cache_bytes = kv_mb << 20;
  ASSIGN_OR_RETURN(o.engine.cpu.kv_dtype, ParseKvDType(absl::GetFlag(FLAGS_kv_dtype)));
  o.engine.scheduler.max_running = absl::GetFlag(FLAGS_max_running);
  o.engine.scheduler.max_tokens_per_step = absl::GetFlag(FLAGS_max_tokens_per_step);
  o.engine.scheduler.max_prefill_tokens = absl::GetFlag(FLAGS_max_prefill_tokens);
  o.engine.enable_prefix_caching = absl::GetFlag(FLAGS_prefix_caching);
  o.engine.model_id = absl::GetFlag(FLAGS_model_id);
  o.max_requests = absl::GetFlag(FLAGS_max_requests);
  return f;
}

namespace {

absl::Status Start(WorkerProcess& w) {
  ASSIGN_OR_RETURN(w.flags, WorkerFlagsFromCommandLine());
  ASSIGN_OR_RETURN(w.channel_security, ChannelSecurityFor(w.flags.tls));
  // Mutual TLS with --tls_ca: only the cluster's components (their certificates chain to the
  // cluster CA) may send a worker work or read its state.
  ASSIGN_OR_RETURN(w.server_credentials, ServerCredentialsFor(w.flags.tls, ClientAuth::kClusterPeers));
  ASSIGN_OR_RETURN(w.transport, kvtransfer::CreateUcxTransport(
                                    {.name = w.flags.worker_id, .transports = w.flags.ucx_tls}));
  // The pool lives in memory the transport exposes best (shared memory for UCX on one host).
  w.flags.loop.engine.kv_allocator = w.transport->PoolAllocator();
  ASSIGN_OR_RETURN(w.loop, EngineLoop::Start(w.flags.model_path, w.flags.loop));
  if (absl::GetFlag(FLAGS_calibrate)) {
    const absl::Time start = absl::Now();
    RETURN_IF_ERROR(w.loop->Calibrate());
    LOG(INFO) << "calibrated in " << absl::FormatDuration(absl::Now() - start);
  }
  if (!w.flags.metrics_listen.empty()) {
    MetricsServerOptions metrics{.listen = w.flags.metrics_listen};
    if (w.flags.metrics_tls) metrics.tls = w.flags.tls;
    RETURN_IF_ERROR(StartProcessMetricsServer(metrics).status());
  }
  ASSIGN_OR_RETURN(kvtransfer::PoolDescriptor pool, w.transport->RegisterPool(&w.loop->kv_storage()));
  kvtransfer::ToProto(pool, &w.pool);
  return absl::OkStatus();
}

}  // namespace

int RunWorkerProcess(
    int argc, char** argv, const char* role, const char* usage,
    const std::function<std::vector<std::unique_ptr<grpc::Service>>(WorkerProcess&)>& make_services) {
  BlockTerminationSignals();
  ParseFlagsWithEnvironment(argc, argv, usage);
  WorkerProcess w;
  absl::Status status = Start(w);
  if (status.ok()) {
    std::vector<std::unique_ptr<grpc::Service>> services = make_services(w);
    std::vector<grpc::Service*> raw;
    ServeOptions serve{.keepalive = w.flags.keepalive, .drain_timeout = w.flags.drain_timeout};
    serve.credentials = w.server_credentials;
    for (auto& s : services) {
      raw.push_back(s.get());
      // In the services' order: the work's services before the state subscriptions, so that
      // the routers hear of the drain's end only after the streams were handed off.
      if (auto* d = dynamic_cast<Drainable*>(s.get()); d != nullptr) serve.drainables.push_back(d);
    }
    status = ServeUntilSignal(w.flags.listen, raw, [&](int port) {
      std::printf("%s %s listening on port %d (model %s, metrics port %d%s)\n", role,
                  w.flags.worker_id.c_str(), port, w.loop->model_id().c_str(), ProcessMetricsPort(),
                  ProcessMetricsOverTls() ? ", https" : "");
      std::fflush(stdout);
    }, serve);
    // Stopped in order: the services (their threads and timers), then the engine, then the
    // transport whose memory holds the engine's pool.
    services.clear();
    w.loop.reset();
    LOG(INFO) << "engine stopped";
    w.transport.reset();
    LOG(INFO) << "exiting";
  }
  if (!status.ok()) {
    std::fprintf(stderr, "%s: %s\n", role, status.ToString().c_str());
    return 1;
  }
  return 0;
}

}  // namespace tandem
