#include "cli/up.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <thread>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "common/cluster_certificates.h"
#include "common/net.h"
#include "common/tls_flags.h"

ABSL_FLAG(int32_t, prefill_workers, 1, "Prefill workers `tandem up` starts");
ABSL_FLAG(int32_t, decode_workers, 1, "Decode workers `tandem up` starts");
ABSL_FLAG(bool, aggregated, false, "`tandem up`: decode workers only, each prefilling its own prompts");
ABSL_FLAG(std::string, host, "127.0.0.1", "`tandem up`: the address the router listens on");
ABSL_FLAG(int32_t, http_port, 8000, "`tandem up`: the router's OpenAI HTTP port (0: any)");
ABSL_FLAG(int32_t, grpc_port, 7000, "`tandem up`: the router's gRPC port (0: any)");
ABSL_FLAG(std::string, policy, "kv_aware", "`tandem up`: placement policy of the router");
ABSL_FLAG(int32_t, worker_threads, 1, "`tandem up`: kernel threads per worker");
ABSL_FLAG(int64_t, worker_kv_cache_mb, 256, "`tandem up`: KV cache memory per worker, MiB");
ABSL_FLAG(int64_t, worker_max_prefill_tokens, 128,
          "`tandem up`: most prompt tokens per engine step on prefill workers, and on decode "
          "workers when there are none (0: the step budget); bounds how long a higher-priority "
          "prompt waits behind long lower ones");
ABSL_FLAG(int64_t, decode_max_prefill_tokens, 32,
          "`tandem up`: most prompt tokens per engine step on decode workers beside prefill "
          "workers (0: the step budget); they compute the prompts the router keeps local between "
          "their streams' tokens, and smaller pieces keep those streams' TPOT steady");
ABSL_FLAG(std::string, api_keys_file, "",
          "`tandem up`: the router's --api_keys_file (docs/security.md): clients then need "
          "'Authorization: Bearer <key>'; `tandem apikey` makes keys. Empty: no keys needed");
ABSL_FLAG(bool, tls, false,
          "`tandem up`: TLS everywhere (docs/security.md): a throwaway CA and certificate made for "
          "this run (kept in a fresh folder under $TMPDIR, removed when the cluster stops), "
          "mutual TLS between the processes, HTTPS and TLS on the router's APIs. With "
          "--tls_cert/--tls_key/--tls_ca those files instead");
ABSL_FLAG(std::string, worker_kv_dtype, "f16",
          "`tandem up`: KV cache element type of every worker, f16 or f32");

namespace tandem {
namespace {

volatile sig_atomic_t stop_requested = 0;

// A child process whose stdout is read line by line on a thread (and echoed, prefixed).
struct Child {
  std::string name;
  pid_t pid = -1;
  std::atomic<int> port{0};
  std::atomic<int> http_port{0};     // the router's
  std::atomic<int> metrics_port{0};  // a worker's /metrics
  std::thread reader;
};

// Starts `argv` with stdout/stderr into a pipe; the child dies with this process (PDEATHSIG).
absl::Status Spawn(Child* child, const std::vector<std::string>& argv) {
  int fds[2];
  if (pipe(fds) != 0) return absl::InternalError("pipe failed");
  const pid_t parent = getpid();
  const pid_t pid = fork();
  if (pid < 0) return absl::InternalError("fork failed");
  if (pid == 0) {
    prctl(PR_SET_PDEATHSIG, SIGTERM);
    if (getppid() != parent) _exit(1);
    sigset_t none;
    sigemptyset(&none);
    sigprocmask(SIG_SETMASK, &none, nullptr);
    dup2(fds[1], STDOUT_FILENO);
    dup2(fds[1], STDERR_FILENO);
    close(fds[0]);
    close(fds[1]);
    std::vector<char*> args;
    for (const std::string& a : argv) args.push_back(const_cast<char*>(a.c_str()));
    args.push_back(nullptr);
    execv(args[0], args.data());
    std::fprintf(stderr, "cannot run %s\n", args[0]);
    _exit(127);
  }
  close(fds[1]);
  child->pid = pid;
  child->reader = std::thread([child, fd = fds[0]] {
    FILE* in = fdopen(fd, "r");
    char line[8192];
    while (std::fgets(line, sizeof(line), in) != nullptr) {
      const std::string text(line);
      const size_t at = text.find("listening on port ");
      if (child->port == 0 && at != std::string::npos) {
        const size_t http = text.find("http port ");
        if (http != std::string::npos) child->http_port = std::atoi(text.c_str() + http + 10);
        const size_t metrics = text.find("metrics port ");
        if (metrics != std::string::npos) {
          child->metrics_port = std::atoi(text.c_str() + metrics + 13);
        }
        child->port = std::atoi(text.c_str() + at + 18);
      }
      std::fprintf(stderr, "[%s] %s", child->name.c_str(), line);
    }
    std::fclose(in);
  });
  return absl::OkStatus();
}

bool Alive(const Child& c) {
  int status = 0;
  return c.pid > 0 && waitpid(c.pid, &status, WNOHANG) == 0;
}

void StopAll(std::vector<std::unique_ptr<Child>>& children) {
  for (auto& c : children) {
    if (c->pid > 0) kill(c->pid, SIGTERM);
  }
  const absl::Time until = absl::Now() + absl::Seconds(10);
  for (auto& c : children) {
    while (c->pid > 0 && absl::Now() < until) {
      int status = 0;
      if (waitpid(c->pid, &status, WNOHANG) != 0) {
        c->pid = -1;
        break;
      }
      absl::SleepFor(absl::Milliseconds(20));
    }
    if (c->pid > 0) {
      kill(c->pid, SIGKILL);
      waitpid(c->pid, nullptr, 0);
      c->pid = -1;
    }
    if (c->reader.joinable()) c->reader.join();
  }
}

// The folder of the throwaway certificates, removed with what it holds when the cluster stops.
struct ThrowawayFolder {
  std::string path;
  ~ThrowawayFolder() {
    if (path.empty()) return;
    for (const char* name : {"ca.crt", "tls.crt", "tls.key"}) {
      ::unlink(absl::StrCat(path, "/", name).c_str());
    }
    ::rmdir(path.c_str());
  }
};

}  // namespace

int RunUp(const std::string& model_path, const std::string& bin_dir) {
  const int prefill = absl::GetFlag(FLAGS_aggregated) ? 0 : absl::GetFlag(FLAGS_prefill_workers);
  const int decode = absl::GetFlag(FLAGS_decode_workers);
  if (prefill < 0 || decode < 1) {
    std::fprintf(stderr, "error: --decode_workers must be >= 1 and --prefill_workers >= 0\n");
    return 2;
  }
  for (const char* component : {"tandem-router", "tandem-prefill", "tandem-decode"}) {
    if (::access(absl::StrCat(bin_dir, "/", component).c_str(), X_OK) != 0) {
      std::fprintf(stderr, "error: %s/%s is missing: build the project first\n", bin_dir.c_str(),
                   component);
      return 1;
    }
  }
  // TLS: the user's files, or with --tls alone a throwaway CA and certificate for this run.
  absl::StatusOr<TlsOptions> tls = TlsOptionsFromFlags();
  if (!tls.ok()) {
    std::fprintf(stderr, "error: %s\n", std::string(tls.status().message()).c_str());
    return 2;
  }
  ThrowawayFolder throwaway;
  if (TlsEnabled(*tls) && (tls->cert_file.empty() || tls->ca_file.empty())) {
    std::fprintf(stderr,
                 "error: `tandem up` with TLS files needs all of --tls_cert, --tls_key and "
                 "--tls_ca (or --tls alone for throwaway ones)\n");
    return 2;
  }
  if (absl::GetFlag(FLAGS_tls) && !TlsEnabled(*tls)) {
    const char* tmp = std::getenv("TMPDIR");
    std::string folder = absl::StrCat(tmp != nullptr && *tmp != '\0' ? tmp : "/tmp",
                                      "/tandem-tls-XXXXXX");
    if (::mkdtemp(folder.data()) == nullptr) {
      std::fprintf(stderr, "error: cannot make a folder for the certificates (%s)\n",
                   folder.c_str());
      return 1;
    }
    throwaway.path = folder;
    std::vector<std::string> hosts = {"127.0.0.1", "localhost"};
    if (const std::string host = absl::GetFlag(FLAGS_host);
        host != "127.0.0.1" && host != "localhost" && host != "0.0.0.0") {
      hosts.push_back(host);
    }
    absl::StatusOr<ClusterCertificates> made =
        MakeClusterCertificates(folder, hosts, absl::Hours(24 * 30));
    if (!made.ok()) {
      std::fprintf(stderr, "error: %s\n", std::string(made.status().message()).c_str());
      return 1;
    }
    tls->cert_file = made->cert_file;
    tls->key_file = made->key_file;
    tls->ca_file = made->ca_file;
  }
  const bool use_tls = TlsEnabled(*tls);
  std::vector<std::string> tls_flags;
  if (use_tls) {
    tls_flags = {absl::StrCat("--tls_cert=", tls->cert_file),
                 absl::StrCat("--tls_key=", tls->key_file),
                 absl::StrCat("--tls_ca=", tls->ca_file),
                 absl::StrCat("--tls_reload_s=", absl::ToInt64Seconds(tls->reload_period))};
  }
  // One host: KV moves over shared memory unless the user chose the UCX transports.
  setenv("UCX_TLS", "posix,self", /*overwrite=*/0);
  struct sigaction on_signal {};
  on_signal.sa_handler = [](int) { stop_requested = 1; };
  sigaction(SIGINT, &on_signal, nullptr);
  sigaction(SIGTERM, &on_signal, nullptr);

  std::vector<std::unique_ptr<Child>> children;
  auto start = [&](const std::string& name, std::vector<std::string> argv) -> Child* {
    auto c = std::make_unique<Child>();
    c->name = name;
    if (absl::Status s = Spawn(c.get(), argv); !s.ok()) {
      std::fprintf(stderr, "error: %s: %s\n", name.c_str(), std::string(s.message()).c_str());
      return nullptr;
    }
    children.push_back(std::move(c));
    return children.back().get();
  };
  const std::vector<std::string> worker_flags = {
      absl::StrCat("--model=", model_path), "--listen=127.0.0.1:0",
      "--metrics_listen=127.0.0.1:0",
      absl::StrCat("--threads=", absl::GetFlag(FLAGS_worker_threads)),
      absl::StrCat("--kv_cache_mb=", absl::GetFlag(FLAGS_worker_kv_cache_mb)),
      absl::StrCat("--kv_dtype=", absl::GetFlag(FLAGS_worker_kv_dtype)),
      // The whole cluster stops at once (StopAll): a worker's streams have nowhere to move, so
      // a drain is only worth the time its streams take to end, well within StopAll's 10 s.
      "--drain_timeout_ms=5000"};
  std::vector<std::string> worker_flags_all = worker_flags;
  worker_flags_all.insert(worker_flags_all.end(), tls_flags.begin(), tls_flags.end());
  // Everything on: the workers' /metrics too (over HTTPS, trusting the same CA).
  if (use_tls) worker_flags_all.push_back("--metrics_tls");
  // A decode worker beside prefill workers prefills only what the router keeps local, in steps
  // its streams share; alone (aggregated) it prefills everything, like a prefill worker.
  const int64_t decode_prefill_cap = prefill > 0 ? absl::GetFlag(FLAGS_decode_max_prefill_tokens)
                                                 : absl::GetFlag(FLAGS_worker_max_prefill_tokens);
  std::vector<Child*> workers;
  for (int i = 0; i < prefill; ++i) {
    std::vector<std::string> argv = {absl::StrCat(bin_dir, "/tandem-prefill"),
                                     absl::StrCat("--worker_id=prefill-", i)};
    argv.insert(argv.end(), worker_flags_all.begin(), worker_flags_all.end());
    argv.push_back(absl::StrCat("--max_prefill_tokens=",
                                absl::GetFlag(FLAGS_worker_max_prefill_tokens)));
    workers.push_back(start(absl::StrCat("prefill-", i), argv));
  }
  for (int i = 0; i < decode; ++i) {
    std::vector<std::string> argv = {absl::StrCat(bin_dir, "/tandem-decode"),
                                     absl::StrCat("--worker_id=decode-", i)};
    argv.insert(argv.end(), worker_flags_all.begin(), worker_flags_all.end());
    argv.push_back(absl::StrCat("--max_prefill_tokens=", decode_prefill_cap));
    workers.push_back(start(absl::StrCat("decode-", i), argv));
  }
  auto fail = [&](const std::string& why) {
    std::fprintf(stderr, "error: %s\n", why.c_str());
    StopAll(children);
    return 1;
  };
  for (Child* w : workers) {
    if (w == nullptr) return fail("a worker did not start");
  }
  // Workers load the model; wait until each listens.
  const absl::Time until = absl::Now() + absl::Seconds(120);
  std::vector<std::string> addresses;
  std::vector<std::string> listing;  // for the summary
  for (Child* w : workers) {
    while (w->port == 0 && !stop_requested && absl::Now() < until) {
      if (!Alive(*w)) return fail(absl::StrCat(w->name, " exited during start-up"));
      absl::SleepFor(absl::Milliseconds(20));
    }
    if (w->port == 0) return fail(absl::StrCat(w->name, " did not start in time"));
    addresses.push_back(absl::StrCat("127.0.0.1:", w->port.load()));
    listing.push_back(absl::StrCat(w->name, " 127.0.0.1:", w->port.load(),
                                   " (metrics http://127.0.0.1:", w->metrics_port.load(),
                                   "/metrics)"));
  }
  const std::string host = absl::GetFlag(FLAGS_host);
  std::vector<std::string> router_args = {
      absl::StrCat(bin_dir, "/tandem-router"), absl::StrCat("--model=", model_path),
      absl::StrCat("--workers=", absl::StrJoin(addresses, ",")),
      absl::StrCat("--listen=", host, ":", absl::GetFlag(FLAGS_grpc_port)),
      absl::StrCat("--http_listen=", host, ":", absl::GetFlag(FLAGS_http_port)),
      absl::StrCat("--policy=", absl::GetFlag(FLAGS_policy)),
      // Like the workers' (StopAll gives every process 10 s).
      "--drain_timeout_ms=5000"};
  const std::string api_keys_file = absl::GetFlag(FLAGS_api_keys_file);
  if (!api_keys_file.empty()) router_args.push_back(absl::StrCat("--api_keys_file=", api_keys_file));
  router_args.insert(router_args.end(), tls_flags.begin(), tls_flags.end());
  Child* router = start("router", router_args);
  if (router == nullptr) return fail("the router did not start");
  while (router->port == 0 && !stop_requested && absl::Now() < until) {
    if (!Alive(*router)) return fail("the router exited during start-up");
    absl::SleepFor(absl::Milliseconds(20));
  }
  // The router's line names its HTTP port too: "... (http port N, ...".
  const int http_port = router->http_port;
  // Healthy once every decode worker has joined the router.
  bool healthy = false;
  while (!stop_requested && absl::Now() < until) {
    if (!Alive(*router)) return fail("the router exited during start-up");
    // The router's certificate names 127.0.0.1 (and --host): check it as a client would.
    const std::string dial = host == "0.0.0.0" ? "127.0.0.1" : host;
    absl::StatusOr<int> status =
        use_tls ? HttpsGetStatus(dial, http_port, "/health", tls->ca_file)
                : [&]() -> absl::StatusOr<int> {
      absl::StatusOr<HttpResponse> health =
          HttpGet(HostPort{host, http_port}, "/health", absl::Seconds(1));
      if (!health.ok()) return health.status();
      return health->status;
    }();
    if (status.ok() && *status == 200) {
      healthy = true;
      break;
    }
    absl::SleepFor(absl::Milliseconds(100));
  }
  if (!healthy) return fail(stop_requested ? "interrupted" : "the cluster did not become healthy");
  const char* scheme = use_tls ? "https" : "http";
  const std::string cacert = use_tls ? absl::StrCat(" --cacert ", tls->ca_file) : "";
  std::printf(
      "\ntandem cluster ready: %d prefill + %d decode worker(s)%s, policy %s\n"
      "  OpenAI HTTP API: %s://%s:%d/v1   (metrics: %s://%s:%d/metrics)\n"
      "  gRPC API:        %s:%d (tandem.v1.Inference%s)\n"
      "  workers:         %s\n%s\n"
      "try:\n"
      "  curl%s %s://%s:%d/v1/chat/completions -H 'Content-Type: application/json'%s \\\n"
      "    -d '{\"messages\": [{\"role\": \"user\", \"content\": \"What is the capital of France? "
      "Answer in one sentence.\"}], \"max_tokens\": 32}'\n\n"
      "Ctrl-C stops the cluster.\n",
      prefill, decode, absl::GetFlag(FLAGS_aggregated) ? " (aggregated)" : "",
      absl::GetFlag(FLAGS_policy).c_str(), scheme, host.c_str(), http_port, scheme, host.c_str(),
      http_port, host.c_str(), router->port.load(), use_tls ? ", TLS" : "",
      absl::StrJoin(listing, "\n                   ").c_str(),
      use_tls ? absl::StrCat("  TLS CA:          ", tls->ca_file,
                             " (clients trust it: curl --cacert, `tandem generate --url=HOST:PORT "
                             "--tls_ca=`, an OpenAI client's CA bundle)\n")
                    .c_str()
              : "",
      cacert.c_str(), scheme, host.c_str(), http_port,
      api_keys_file.empty() ? "" : " \\\n    -H \"Authorization: Bearer $API_KEY\"");
  std::fflush(stdout);
  while (!stop_requested) {
    for (const auto& c : children) {
      if (!Alive(*c)) {
        return fail(absl::StrCat(c->name, " exited unexpectedly; stopping the cluster"));
      }
    }
    absl::SleepFor(absl::Milliseconds(200));
  }
  std::printf("stopping the cluster\n");
  std::fflush(stdout);
  StopAll(children);
  return 0;
}

}  // namespace tandem
