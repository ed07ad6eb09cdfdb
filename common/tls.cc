#include "common/tls.h"

#include <openssl/bio.h>
#include <openssl/err.h>
#include <openssl/pem.h>
#include <openssl/x509.h>

#include <algorithm>
#include <cstdio>

#include "absl/strings/str_cat.h"
#include "grpcpp/security/tls_certificate_provider.h"
#include "grpcpp/security/tls_certificate_verifier.h"
#include "grpcpp/security/tls_credentials_options.h"

namespace tandem {
namespace {

struct BioFree {
  void operator()(BIO* b) const { BIO_free(b); }
};
struct X509Free {
  void operator()(X509* x) const { X509_free(x); }
};
struct KeyFree {
  void operator()(EVP_PKEY* k) const { EVP_PKEY_free(k); }
};
using Bio = std::unique_ptr<BIO, BioFree>;

absl::StatusOr<Bio> OpenFile(const std::string& path, const char* what) {
  Bio bio(BIO_new_file(path.c_str(), "r"));
  if (bio == nullptr) {
    ERR_clear_error();
    return absl::InvalidArgumentError(absl::StrCat(what, " '", path, "' cannot be read"));
  }
  return bio;
}

// The first certificate of the PEM file at `path`; `count` gets how many it holds.
absl::StatusOr<std::unique_ptr<X509, X509Free>> ReadCertificates(const std::string& path,
                                                                 const char* what, int* count) {
  absl::StatusOr<Bio> bio = OpenFile(path, what);
  if (!bio.ok()) return bio.status();
  std::unique_ptr<X509, X509Free> first;
  *count = 0;
  while (X509* x = PEM_read_bio_X509(bio->get(), nullptr, nullptr, nullptr)) {
    if (first == nullptr) {
      first.reset(x);
    } else {
      X509_free(x);
    }
    ++*count;
  }
  ERR_clear_error();  // the end of the file reads as an error
  if (first == nullptr) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, " '", path, "' holds no PEM certificate"));
  }
  return first;
}

unsigned ReloadSeconds(absl::Duration period) {
  return static_cast<unsigned>(std::max<int64_t>(1, absl::ToInt64Seconds(period)));
}

// Watches the files that are given (gRPC reads them again every `reload_period`).
std::shared_ptr<grpc::experimental::CertificateProviderInterface> Provider(
    const TlsOptions& o, bool with_identity, bool with_roots) {
  return std::make_shared<grpc::experimental::FileWatcherCertificateProvider>(
      with_identity ? o.key_file : "", with_identity ? o.cert_file : "",
      with_roots ? o.ca_file : "", ReloadSeconds(o.reload_period));
}

}  // namespace

bool TlsEnabled(const TlsOptions& options) {
  return !options.cert_file.empty() || !options.key_file.empty() || !options.ca_file.empty();
}

absl::Status ValidateTls(const TlsOptions& o) {
  if (!TlsEnabled(o)) return absl::OkStatus();
  if (o.reload_period < absl::Seconds(1)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "the TLS reload period must be at least 1 s, got ", absl::FormatDuration(o.reload_period)));
  }
  if (o.cert_file.empty() != o.key_file.empty()) {
    return absl::InvalidArgumentError(
        "give the TLS certificate and its key together (--tls_cert and --tls_key)");
  }
  if (!o.cert_file.empty()) {
    int count = 0;
    absl::StatusOr<std::unique_ptr<X509, X509Free>> cert =
        ReadCertificates(o.cert_file, "the TLS certificate", &count);
    if (!cert.ok()) return cert.status();
    absl::StatusOr<Bio> bio = OpenFile(o.key_file, "the TLS key");
    if (!bio.ok()) return bio.status();
    std::unique_ptr<EVP_PKEY, KeyFree> key(
        PEM_read_bio_PrivateKey(bio->get(), nullptr, nullptr, nullptr));
    ERR_clear_error();
    if (key == nullptr) {
      return absl::InvalidArgumentError(absl::StrCat(
          "the TLS key '", o.key_file, "' holds no unencrypted PEM private key"));
    }
    if (X509_check_private_key(cert->get(), key.get()) != 1) {
      ERR_clear_error();
      return absl::InvalidArgumentError(absl::StrCat("the TLS key '", o.key_file,
                                                     "' is not the key of the certificate '",
                                                     o.cert_file, "'"));
    }
  }
  if (!o.ca_file.empty()) {
    int count = 0;
    absl::StatusOr<std::unique_ptr<X509, X509Free>> ca =
        ReadCertificates(o.ca_file, "the TLS CA bundle", &count);
    if (!ca.ok()) return ca.status();
  }
  return absl::OkStatus();
}

absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> ServerCredentialsFor(
    const TlsOptions& o, ClientAuth client_auth) {
  if (!TlsEnabled(o)) return grpc::InsecureServerCredentials();
  if (o.cert_file.empty()) {
    return absl::InvalidArgumentError(
        "a TLS server needs its certificate and key (--tls_cert and --tls_key)");
  }
  const bool verify_clients = client_auth == ClientAuth::kClusterPeers && !o.ca_file.empty();
  grpc::experimental::TlsServerCredentialsOptions options(
      Provider(o, /*with_identity=*/true, /*with_roots=*/verify_clients));
  options.watch_identity_key_cert_pairs();
  if (verify_clients) {
    options.watch_root_certs();
    options.set_cert_request_type(GRPC_SSL_REQUEST_AND_REQUIRE_CLIENT_CERTIFICATE_AND_VERIFY);
  } else {
    options.set_cert_request_type(GRPC_SSL_DONT_REQUEST_CLIENT_CERTIFICATE);
  }
  return grpc::experimental::TlsServerCredentials(options);
}

absl::StatusOr<ChannelSecurity> ChannelSecurityFor(const TlsOptions& o) {
  if (!TlsEnabled(o)) return ChannelSecurity{};
  const bool with_identity = !o.cert_file.empty();
  const bool with_roots = !o.ca_file.empty();
  grpc::experimental::TlsChannelCredentialsOptions options;
  if (with_identity || with_roots) {
    options.set_certificate_provider(Provider(o, with_identity, with_roots));
  }
  if (with_identity) options.watch_identity_key_cert_pairs();
  if (with_roots) options.watch_root_certs();
  // The chain is checked against the CA, and the certificate must name the host dialled (or
  // server_name).
  options.set_verify_server_certs(true);
  options.set_certificate_verifier(
      std::make_shared<grpc::experimental::HostNameCertificateVerifier>());
  std::shared_ptr<grpc::ChannelCredentials> credentials =
      grpc::experimental::TlsCredentials(options);
  if (credentials == nullptr) return absl::InternalError("gRPC made no TLS channel credentials");
  return ChannelSecurity{.credentials = std::move(credentials), .server_name = o.server_name};
}

std::shared_ptr<grpc::ChannelCredentials> ApplyChannelSecurity(const ChannelSecurity& security,
                                                               grpc::ChannelArguments* args) {
  if (security.credentials == nullptr) return grpc::InsecureChannelCredentials();
  if (!security.server_name.empty()) args->SetSslTargetNameOverride(security.server_name);
  return security.credentials;
}

}  // namespace tandem
