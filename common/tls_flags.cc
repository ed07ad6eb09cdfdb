#include "common/tls_flags.h"

#include <string>

#include "absl/flags/flag.h"
#include "absl/strings/str_cat.h"

ABSL_FLAG(std::string, tls_cert, "",
          "PEM certificate chain this process presents, as a TLS server and (mutual TLS) as a "
          "client; with --tls_key. Empty (and no --tls_ca): plaintext (docs/security.md)");
ABSL_FLAG(std::string, tls_key, "", "PEM private key of --tls_cert");
ABSL_FLAG(std::string, tls_ca, "",
          "PEM bundle of the cluster CA: the certificates of this process's peers must chain to "
          "it, and its gRPC servers then require client certificates (mutual TLS) -- except the "
          "router's public APIs, which any TLS client may use");
ABSL_FLAG(int64_t, tls_reload_s, 10,
          "How often the TLS files are checked for changes (a new certificate is used for the "
          "handshakes that follow), s; >= 1");
ABSL_FLAG(std::string, tls_server_name, "",
          "The name a server's certificate must carry (DNS SAN) instead of the host dialled, for "
          "peers dialled by IP whose certificates name a Service; empty: the host dialled");

namespace tandem {

absl::StatusOr<TlsOptions> TlsOptionsFromFlags() {
  TlsOptions options{.cert_file = absl::GetFlag(FLAGS_tls_cert),
                     .key_file = absl::GetFlag(FLAGS_tls_key),
                     .ca_file = absl::GetFlag(FLAGS_tls_ca),
                     .reload_period = absl::Seconds(absl::GetFlag(FLAGS_tls_reload_s)),
                     .server_name = absl::GetFlag(FLAGS_tls_server_name)};
  if (absl::GetFlag(FLAGS_tls_reload_s) < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("--tls_reload_s must be at least 1, got ", absl::GetFlag(FLAGS_tls_reload_s)));
  }
  if (absl::Status s = ValidateTls(options); !s.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("--tls_*: ", s.message()));
  }
  return options;
}

}  // namespace tandem
