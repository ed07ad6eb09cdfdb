#include "common/cluster_certificates.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <openssl/bio.h>
#include <openssl/bn.h>
#include <openssl/err.h>
#include <openssl/evp.h>
#include <openssl/pem.h>
#include <openssl/rand.h>
#include <openssl/ssl.h>
#include <openssl/x509.h>
#include <openssl/x509v3.h>
#include <unistd.h>

#include <memory>
#include <utility>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace tandem {
namespace {

struct Free {
  void operator()(EVP_PKEY* p) const { EVP_PKEY_free(p); }
  void operator()(X509* p) const { X509_free(p); }
  void operator()(BIO* p) const { BIO_free_all(p); }
  void operator()(SSL_CTX* p) const { SSL_CTX_free(p); }
  void operator()(BIGNUM* p) const { BN_free(p); }
};
using Key = std::unique_ptr<EVP_PKEY, Free>;
using Cert = std::unique_ptr<X509, Free>;

absl::Status OpenSslFailure(absl::string_view what) {
  const unsigned long code = ERR_get_error();  // NOLINT: OpenSSL's type
  ERR_clear_error();
  char text[256] = "unknown error";
  if (code != 0) ERR_error_string_n(code, text, sizeof(text));
  return absl::InternalError(absl::StrCat(what, ": ", text));
}

bool IsIpAddress(const std::string& host) {
  unsigned char buffer[16];
  return inet_pton(AF_INET, host.c_str(), buffer) == 1 ||
         inet_pton(AF_INET6, host.c_str(), buffer) == 1;
}

// A certificate for `subject_key` named `common_name` with `extensions` (nid, OpenSSL's config
// text), signed by `issuer` with `issuer_key` (itself when `issuer` is null).
absl::StatusOr<Cert> Sign(EVP_PKEY* subject_key, const std::string& common_name, X509* issuer,
                          EVP_PKEY* issuer_key,
                          const std::vector<std::pair<int, std::string>>& extensions,
                          absl::Duration lifetime) {
  Cert cert(X509_new());
  if (cert == nullptr) return OpenSslFailure("X509_new");
  X509* x = cert.get();
  unsigned char serial[16];
  if (RAND_bytes(serial, sizeof(serial)) != 1) return OpenSslFailure("RAND_bytes");
  serial[0] &= 0x7f;  // positive
  std::unique_ptr<BIGNUM, Free> bn(BN_bin2bn(serial, sizeof(serial), nullptr));
  if (bn == nullptr || X509_set_version(x, 2) != 1 ||
      BN_to_ASN1_INTEGER(bn.get(), X509_get_serialNumber(x)) == nullptr ||
      X509_gmtime_adj(X509_getm_notBefore(x), -3600) == nullptr ||
      X509_gmtime_adj(X509_getm_notAfter(x), absl::ToInt64Seconds(lifetime)) == nullptr ||
      X509_set_pubkey(x, subject_key) != 1) {
    return OpenSslFailure("a certificate's fields");
  }
  X509_NAME* name = X509_get_subject_name(x);
  if (X509_NAME_add_entry_by_txt(name, "CN", MBSTRING_UTF8,
                                 reinterpret_cast<const unsigned char*>(common_name.c_str()), -1,
                                 -1, 0) != 1 ||
      X509_set_issuer_name(x, issuer != nullptr ? X509_get_subject_name(issuer) : name) != 1) {
    return OpenSslFailure("a certificate's names");
  }
  X509V3_CTX context;
  X509V3_set_ctx_nodb(&context);
  X509V3_set_ctx(&context, issuer != nullptr ? issuer : x, x, nullptr, nullptr, 0);
  for (const auto& [nid, value] : extensions) {
    X509_EXTENSION* extension = X509V3_EXT_conf_nid(nullptr, &context, nid, value.c_str());
    if (extension == nullptr) return OpenSslFailure(absl::StrCat("extension '", value, "'"));
    const int added = X509_add_ext(x, extension, -1);
    X509_EXTENSION_free(extension);
    if (added != 1) return OpenSslFailure("X509_add_ext");
  }
  if (X509_sign(x, issuer_key, EVP_sha256()) <= 0) return OpenSslFailure("X509_sign");
  return cert;
}

// Writes with `mode` (created afresh: an old file's looser mode does not survive).
absl::Status WritePem(const std::string& path, int mode, X509* cert, EVP_PKEY* key) {
  ::unlink(path.c_str());
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, mode);
  if (fd < 0) return absl::InternalError(absl::StrCat("cannot create '", path, "'"));
  std::unique_ptr<BIO, Free> bio(BIO_new_fd(fd, BIO_CLOSE));
  if (bio == nullptr) {
    ::close(fd);
    return OpenSslFailure("BIO_new_fd");
  }
  const int written = cert != nullptr
                          ? PEM_write_bio_X509(bio.get(), cert)
                          : PEM_write_bio_PrivateKey(bio.get(), key, nullptr, nullptr, 0,
                                                     nullptr, nullptr);
  if (written != 1 || BIO_flush(bio.get()) != 1) {
    return OpenSslFailure(absl::StrCat("writing '", path, "'"));
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<ClusterCertificates> MakeClusterCertificates(const std::string& dir,
                                                            const std::vector<std::string>& hosts,
                                                            absl::Duration lifetime) {
  if (hosts.empty()) return absl::InvalidArgumentError("a certificate needs at least one host");
  Key ca_key(EVP_EC_gen("P-256"));
  Key key(EVP_EC_gen("P-256"));
  if (ca_key == nullptr || key == nullptr) return OpenSslFailure("EC key generation");
  absl::StatusOr<Cert> ca = Sign(ca_key.get(), "tandem up throwaway CA", nullptr, ca_key.get(),
                                 {{NID_basic_constraints, "critical,CA:TRUE,pathlen:0"},
                                  {NID_key_usage, "critical,keyCertSign,cRLSign"},
                                  {NID_subject_key_identifier, "hash"}},
                                 lifetime);
  if (!ca.ok()) return ca.status();
  std::vector<std::string> names;
  for (const std::string& host : hosts) {
    names.push_back(absl::StrCat(IsIpAddress(host) ? "IP:" : "DNS:", host));
  }
  absl::StatusOr<Cert> cert =
      Sign(key.get(), "tandem up cluster", ca->get(), ca_key.get(),
           {{NID_basic_constraints, "critical,CA:FALSE"},
            {NID_key_usage, "critical,digitalSignature"},
            {NID_ext_key_usage, "serverAuth,clientAuth"},
            {NID_subject_alt_name, absl::StrJoin(names, ",")},
            {NID_subject_key_identifier, "hash"},
            {NID_authority_key_identifier, "keyid:always"}},
           lifetime);
  if (!cert.ok()) return cert.status();
  ClusterCertificates files{.ca_file = absl::StrCat(dir, "/ca.crt"),
                            .cert_file = absl::StrCat(dir, "/tls.crt"),
                            .key_file = absl::StrCat(dir, "/tls.key")};
  if (absl::Status s = WritePem(files.ca_file, 0644, ca->get(), nullptr); !s.ok()) return s;
  if (absl::Status s = WritePem(files.cert_file, 0644, cert->get(), nullptr); !s.ok()) return s;
  if (absl::Status s = WritePem(files.key_file, 0600, nullptr, key.get()); !s.ok()) return s;
  return files;
}

absl::StatusOr<int> HttpsGetStatus(const std::string& host, int port, const std::string& path,
                                   const std::string& ca_file) {
  std::unique_ptr<SSL_CTX, Free> context(SSL_CTX_new(TLS_client_method()));
  if (context == nullptr ||
      SSL_CTX_set_min_proto_version(context.get(), TLS1_2_VERSION) != 1 ||
      SSL_CTX_load_verify_locations(context.get(), ca_file.c_str(), nullptr) != 1) {
    return OpenSslFailure("an HTTPS client context");
  }
  SSL_CTX_set_verify(context.get(), SSL_VERIFY_PEER, nullptr);
  std::unique_ptr<BIO, Free> bio(BIO_new_ssl_connect(context.get()));
  SSL* ssl = nullptr;
  if (bio == nullptr || BIO_get_ssl(bio.get(), &ssl) != 1 || ssl == nullptr) {
    return OpenSslFailure("an HTTPS connection");
  }
  const bool ip = IsIpAddress(host);
  if (ip ? X509_VERIFY_PARAM_set1_ip_asc(SSL_get0_param(ssl), host.c_str()) != 1
         : (SSL_set1_host(ssl, host.c_str()) != 1 ||
            SSL_set_tlsext_host_name(ssl, host.c_str()) != 1)) {
    return OpenSslFailure("the HTTPS host check");
  }
  const std::string address = absl::StrCat(host, ":", port);
  BIO_set_conn_hostname(bio.get(), address.c_str());
  if (BIO_do_connect(bio.get()) <= 0 || BIO_do_handshake(bio.get()) <= 0) {
    ERR_clear_error();
    return absl::UnavailableError(absl::StrCat("no TLS connection to ", address));
  }
  const std::string request =
      absl::StrCat("GET ", path, " HTTP/1.0\r\nHost: ", address, "\r\n\r\n");
  if (BIO_write(bio.get(), request.data(), static_cast<int>(request.size())) !=
      static_cast<int>(request.size())) {
    ERR_clear_error();
    return absl::UnavailableError(absl::StrCat("cannot send to ", address));
  }
  std::string head;
  char buffer[512];
  while (head.find("\r\n") == std::string::npos && head.size() < 4096) {
    const int n = BIO_read(bio.get(), buffer, sizeof(buffer));
    if (n <= 0) break;
    head.append(buffer, static_cast<size_t>(n));
  }
  ERR_clear_error();
  // "HTTP/1.1 200 OK"
  int status = 0;
  const size_t space = head.find(' ');
  if (space == std::string::npos || !absl::SimpleAtoi(head.substr(space + 1, 3), &status)) {
    return absl::UnavailableError(absl::StrCat("no HTTP status line from ", address));
  }
  return status;
}

}  // namespace tandem
