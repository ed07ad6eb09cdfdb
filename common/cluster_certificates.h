// The throwaway certificates of `tandem up --tls` (and of the TLS unit tests): a cluster CA made
// for one run and one certificate it signs, which every process of the local cluster presents
// (as a server and, for mutual TLS, as a client: its extended key usage allows both) and clients
// dial by any of `hosts`. Keys are ECDSA P-256; files PEM, the keys readable by their owner only.
#ifndef TANDEM_COMMON_CLUSTER_CERTIFICATES_H_
#define TANDEM_COMMON_CLUSTER_CERTIFICATES_H_

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace tandem {

struct ClusterCertificates {
  std::string ca_file;    // <dir>/ca.crt: what clients trust
  std::string cert_file;  // <dir>/tls.crt
  std::string key_file;   // <dir>/tls.key
};

// Writes ca.crt, tls.crt and tls.key into `dir` (which must exist), the certificate naming every
// one of `hosts` (an IP address or a DNS name each) and valid for `lifetime` from an hour ago (the
// CA's key is not kept). INVALID_ARGUMENT for no hosts; INTERNAL when OpenSSL or a write fails.
absl::StatusOr<ClusterCertificates> MakeClusterCertificates(const std::string& dir,
                                                            const std::vector<std::string>& hosts,
                                                            absl::Duration lifetime);

// The status code of `GET path` over HTTPS to host:port, the server's certificate checked
// against `ca_file` and `host`. UNAVAILABLE when no TLS connection or no status line comes.
absl::StatusOr<int> HttpsGetStatus(const std::string& host, int port, const std::string& path,
                                   const std::string& ca_file);

}  // namespace tandem

#endif  // TANDEM_COMMON_CLUSTER_CERTIFICATES_H_
