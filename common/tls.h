// TLS for every gRPC listener and channel of the cluster (docs/security.md, "TLS").
//
// One configuration per process: its certificate and key (what it presents, as a server and, for
// mutual TLS, as a client) and the cluster CA (what it checks its peers' certificates against).
// Every file is watched: a changed certificate, key or CA is used for the handshakes that follow
// (cert-manager rotation), without a restart; connections already open keep theirs. Replace the
// certificate and key together (a Kubernetes Secret volume swaps both at once), or a handshake
// in between may find a key that does not match. TLS 1.2 is the oldest version either end
// accepts (gRPC's own floor; docs/security.md has the test that checks it).
//
//   TlsOptions tls{.cert_file = "/tls/tls.crt", .key_file = "/tls/tls.key", .ca_file = "/tls/ca.crt"};
//   RETURN_IF_ERROR(ValidateTls(tls));
//   ASSIGN_OR_RETURN(auto server_credentials, ServerCredentialsFor(tls, ClientAuth::kClusterPeers));
//   ASSIGN_OR_RETURN(ChannelSecurity security, ChannelSecurityFor(tls));
//   auto channel = CreateKeepaliveChannel(address, keepalive, security);  // common/keepalive.h
//
// Without any file (TlsOptions{}) everything is plaintext, as before: the functions return
// insecure credentials.
#ifndef TANDEM_COMMON_TLS_H_
#define TANDEM_COMMON_TLS_H_

#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/tls_options.h"
#include "grpcpp/grpcpp.h"

namespace tandem {

// Which clients a TLS server accepts.
enum class ClientAuth {
  // Only those presenting a certificate that the cluster CA (ca_file) verifies: mutual TLS
  // between the cluster's components. Without ca_file, like kAnyClient.
  kClusterPeers,
  // Any client (none is asked for a certificate): the router's public APIs, where API keys say
  // who a client is.
  kAnyClient,
};

// The credentials of a server: insecure without TLS; else TLS with the certificate and key,
// reloaded every reload_period. INVALID_ARGUMENT when TLS is on but the certificate or key is
// missing. REQUIRES: ValidateTls(options).ok().
absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> ServerCredentialsFor(
    const TlsOptions& options, ClientAuth client_auth);

// What a process's channels to its peers use. Copyable; share one among all channels.
struct ChannelSecurity {
  // Null: insecure (plaintext).
  std::shared_ptr<grpc::ChannelCredentials> credentials;
  // TlsOptions::server_name.
  std::string server_name = {};
};

// The security of the channels of a process with `options`: none without TLS; else TLS checking
// the server against ca_file (the system's CAs without it) and presenting the certificate and
// key when given. REQUIRES: ValidateTls(options).ok().
absl::StatusOr<ChannelSecurity> ChannelSecurityFor(const TlsOptions& options);

// The credentials of a channel with `security` (insecure ones when it has none), and the channel
// arguments it needs (the name checked) added to `args`.
std::shared_ptr<grpc::ChannelCredentials> ApplyChannelSecurity(const ChannelSecurity& security,
                                                               grpc::ChannelArguments* args);

}  // namespace tandem

#endif  // TANDEM_COMMON_TLS_H_
