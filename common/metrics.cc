#include "common/metrics.h"

#include <exception>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "common/https_terminator.h"
#include "common/net.h"
#include "common/server_tls_context.h"
#include "common/status_macros.h"
#include "prometheus/exposer.h"
#include "prometheus/text_serializer.h"

namespace tandem {
namespace {

absl::Mutex g_server_mu;
prometheus::Exposer* g_exposer ABSL_GUARDED_BY(g_server_mu) = nullptr;  // leaked on purpose
// With TLS: the terminator on the public port and the context it uses, leaked with the exposer.
HttpsTerminator* g_terminator ABSL_GUARDED_BY(g_server_mu) = nullptr;
ServerTlsContext* g_tls ABSL_GUARDED_BY(g_server_mu) = nullptr;
int g_port ABSL_GUARDED_BY(g_server_mu) = 0;

std::shared_ptr<prometheus::Registry>& RegistryPtr() {
  static auto* registry = new std::shared_ptr<prometheus::Registry>(
      std::make_shared<prometheus::Registry>());
  return *registry;
}

}  // namespace

prometheus::Registry& ProcessMetrics() { return *RegistryPtr(); }

absl::StatusOr<int> StartProcessMetricsServer(const MetricsServerOptions& options) {
  ASSIGN_OR_RETURN(HostPort address, ParseHostPort(options.listen));
  const bool tls = !options.tls.cert_file.empty() || !options.tls.key_file.empty();
  std::unique_ptr<ServerTlsContext> context;
  if (tls) {
    // The CA plays no part: no client certificate is asked for.
    TlsOptions server = options.tls;
    server.ca_file.clear();
    RETURN_IF_ERROR(ValidateTls(server));
    ASSIGN_OR_RETURN(context, ServerTlsContext::Create(server, ClientAuth::kAnyClient));
  }
  absl::MutexLock lock(&g_server_mu);
  if (g_exposer != nullptr) {
    return absl::FailedPreconditionError(
        absl::StrCat("the metrics server already runs on port ", g_port));
  }
  // With TLS the HTTP server listens on loopback only, behind the terminator.
  const std::string http_address = tls ? "127.0.0.1:0" : address.ToString();
  std::unique_ptr<prometheus::Exposer> exposer;
  try {
    // One civetweb thread is plenty for scrapes.
    exposer = std::make_unique<prometheus::Exposer>(http_address, /*num_threads=*/1);
  } catch (const std::exception& e) {
    return absl::UnavailableError(
        absl::StrCat("cannot serve metrics on ", http_address, ": ", e.what()));
  }
  exposer->RegisterCollectable(RegistryPtr(), "/metrics");
  const std::vector<int> ports = exposer->GetListeningPorts();
  if (ports.empty()) {
    return absl::UnavailableError(
        absl::StrCat("metrics server on ", http_address, " reports no listening port"));
  }
  int port = ports.front();
  if (tls) {
    ASSIGN_OR_RETURN(std::unique_ptr<HttpsTerminator> terminator,
                     HttpsTerminator::Start({.listen = options.listen,
                                             .backend_port = port,
                                             .tls = context.get()}));
    port = terminator->port();
    g_terminator = terminator.release();
    g_tls = context.release();
  }
  g_port = port;
  g_exposer = exposer.release();
  return g_port;
}

absl::StatusOr<int> StartProcessMetricsServer(absl::string_view bind_address) {
  return StartProcessMetricsServer(MetricsServerOptions{.listen = std::string(bind_address)});
}

bool ProcessMetricsOverTls() {
  absl::MutexLock lock(&g_server_mu);
  return g_terminator != nullptr;
}

int ProcessMetricsPort() {
  absl::MutexLock lock(&g_server_mu);
  return g_port;
}

std::string SerializeMetrics(prometheus::Registry& registry) {
  return prometheus::TextSerializer().Serialize(registry.Collect());
}

const prometheus::Histogram::BucketBoundaries& RequestLatencyBuckets() {
  static const auto* buckets = new prometheus::Histogram::BucketBoundaries{
      0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75,
      1.0,   2.5,   5.0,  7.5,  10.0, 20.0, 40.0, 80.0};
  return *buckets;
}

const prometheus::Histogram::BucketBoundaries& TokenLatencyBuckets() {
  static const auto* buckets = new prometheus::Histogram::BucketBoundaries{
      0.0001, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.015, 0.02, 0.025, 0.03, 0.04,
      0.05,   0.075,  0.1,   0.15,   0.2,   0.3,  0.4,   0.5,  0.75,  1.0,  2.5, 5.0, 10.0};
  return *buckets;
}

}  // namespace tandem
