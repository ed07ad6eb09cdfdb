// What TLS a process runs with (common/tls.h has the credentials made from it): the options alone,
// without gRPC's headers, for the many files that only carry them (common/metrics.h).
#ifndef TANDEM_COMMON_TLS_OPTIONS_H_
#define TANDEM_COMMON_TLS_OPTIONS_H_

#include <string>

#include "absl/status/status.h"
#include "absl/time/time.h"

namespace tandem {

struct TlsOptions {
  // PEM certificate chain this process presents (leaf first) and its PEM private key; both or
  // neither. A server needs them; a client presents them to a server that asks (mutual TLS). One
  // pair serves both roles when the certificate's extended key usage allows serverAuth and
  // clientAuth (or names none).
  std::string cert_file = {};
  std::string key_file = {};
  // PEM bundle of the cluster CA. A client checks its server's certificate against it (and that
  // the certificate names the host it dialled, or `server_name`); a server given it requires
  // every client to present a certificate it verifies (ClientAuth::kClusterPeers). Empty on a
  // client: the system's CAs.
  std::string ca_file = {};
  // How often the files are looked at for changes. >= 1 s (gRPC checks in whole seconds).
  absl::Duration reload_period = absl::Seconds(10);
  // Channels: the name a server's certificate must carry (a DNS SAN) instead of the host of the
  // address dialled -- for peers reached by pod IP whose certificates name a Service. Empty: the
  // host dialled.
  std::string server_name = {};
};

// Whether `options` turns TLS on (any file given).
bool TlsEnabled(const TlsOptions& options);

// Checks at start-up what the handshakes would find out later: the certificate and key given
// together, readable, PEM, and matching; the CA bundle readable and holding a certificate; the
// reload period. INVALID_ARGUMENT naming the file and the reason. OK for TlsOptions{}.
absl::Status ValidateTls(const TlsOptions& options);

}  // namespace tandem

#endif  // TANDEM_COMMON_TLS_OPTIONS_H_
