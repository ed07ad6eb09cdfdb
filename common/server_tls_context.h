// The OpenSSL context of a TLS server that is not gRPC (the router's HTTPS API), kept current
// with its files: every `reload_period` the certificate, key and CA files are read, and when
// their content changed a new context is built from them and used for the connections accepted
// after that (connections already open keep theirs). A change that does not load (a key that
// does not match, a half-written file) keeps the previous context and is logged once per
// content. TLS 1.2 is the oldest version accepted.
//
//   ASSIGN_OR_RETURN(std::unique_ptr<ServerTlsContext> tls,
//                    ServerTlsContext::Create(options, ClientAuth::kAnyClient));
//   SSL* ssl = tls->NewSsl();  // per accepted connection
//
// Thread-safe: NewSsl may be called from any thread while a reload runs.
#ifndef TANDEM_COMMON_SERVER_TLS_CONTEXT_H_
#define TANDEM_COMMON_SERVER_TLS_CONTEXT_H_

#include <openssl/ssl.h>

#include <cstdint>
#include <memory>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "common/periodic_thread.h"
#include "common/tls.h"

namespace tandem {

class ServerTlsContext {
 public:
  // INVALID_ARGUMENT when `options` has no certificate and key or its files do not load.
  // kClusterPeers with a CA: clients must present a certificate the CA verifies.
  static absl::StatusOr<std::unique_ptr<ServerTlsContext>> Create(const TlsOptions& options,
                                                                  ClientAuth client_auth);
  ~ServerTlsContext();

  // A new server-side SSL of the current context, owned by the caller (SSL_free), or null when
  // OpenSSL has no memory for it.
  SSL* NewSsl();

  // Loaded contents so far (the first one included): for tests and logs.
  int64_t loads() const;

  // Reads the files now and swaps in a new context if their content changed (what the periodic
  // check does); OK when nothing changed or the new content loaded.
  absl::Status ReloadIfChanged();

 private:
  ServerTlsContext(const TlsOptions& options, ClientAuth client_auth);

  const TlsOptions options_;
  const ClientAuth client_auth_;
  mutable absl::Mutex mu_;
  std::shared_ptr<SSL_CTX> context_ ABSL_GUARDED_BY(mu_);
  std::string loaded_content_ ABSL_GUARDED_BY(mu_);  // of the files behind context_
  std::string failed_content_ ABSL_GUARDED_BY(mu_);  // last content that did not load
  int64_t loads_ ABSL_GUARDED_BY(mu_) = 0;
  std::unique_ptr<PeriodicThread> reload_;  // last: stops before the rest goes
};

}  // namespace tandem

#endif  // TANDEM_COMMON_SERVER_TLS_CONTEXT_H_
