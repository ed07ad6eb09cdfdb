#include "common/tls.h"

#include <openssl/pem.h>
#include <openssl/x509.h>
#include <openssl/x509_vfy.h>
#include <openssl/x509v3.h>
#include <stdlib.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <memory>
#include <string>

#include "common/cluster_certificates.h"
#include "common/server_tls_context.h"
#include "gtest/gtest.h"

namespace tandem {
namespace {

// A fresh folder per test, with one set of throwaway certificates in it.
class TlsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string pattern = ::testing::TempDir() + "/tls_test_XXXXXX";
    ASSERT_NE(::mkdtemp(pattern.data()), nullptr);
    dir_ = pattern;
    absl::StatusOr<ClusterCertificates> made =
        MakeClusterCertificates(dir_, {"127.0.0.1", "localhost"}, absl::Hours(1));
    ASSERT_TRUE(made.ok()) << made.status();
    files_ = *made;
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }

  // Another certificate and key (of another CA) under `name`.crt / `name`.key.
  ClusterCertificates Other(const std::string& name) {
    const std::string other = dir_ + "/" + name;
    std::filesystem::create_directory(other);
    absl::StatusOr<ClusterCertificates> made =
        MakeClusterCertificates(other, {"127.0.0.1"}, absl::Hours(1));
    EXPECT_TRUE(made.ok()) << made.status();
    return *made;
  }

  TlsOptions Options() const {
    return TlsOptions{.cert_file = files_.cert_file, .key_file = files_.key_file,
                      .ca_file = files_.ca_file, .reload_period = absl::Seconds(1)};
  }

  std::string dir_;
  ClusterCertificates files_;
};

X509* ReadCert(const std::string& path) {
  FILE* f = std::fopen(path.c_str(), "r");
  if (f == nullptr) return nullptr;
  X509* x = PEM_read_X509(f, nullptr, nullptr, nullptr);
  std::fclose(f);
  return x;
}

TEST_F(TlsTest, TheThrowawayCertificateChainsToItsCaAndNamesItsHosts) {
  // Checked by OpenSSL's verifier, with the hosts as a client would check them.
  X509* ca = ReadCert(files_.ca_file);
  X509* cert = ReadCert(files_.cert_file);
  ASSERT_NE(ca, nullptr);
  ASSERT_NE(cert, nullptr);
  X509_STORE* store = X509_STORE_new();
  X509_STORE_add_cert(store, ca);
  for (const char* host : {"127.0.0.1", "localhost", "example.com"}) {
    X509_STORE_CTX* ctx = X509_STORE_CTX_new();
    X509_STORE_CTX_init(ctx, store, cert, nullptr);
    X509_VERIFY_PARAM* param = X509_STORE_CTX_get0_param(ctx);
    if (std::string(host) == "127.0.0.1") {
      X509_VERIFY_PARAM_set1_ip_asc(param, host);
    } else {
      X509_VERIFY_PARAM_set1_host(param, host, 0);
    }
    X509_VERIFY_PARAM_set_purpose(param, X509_PURPOSE_SSL_SERVER);
    EXPECT_EQ(X509_verify_cert(ctx) == 1, std::string(host) != "example.com") << host;
    X509_STORE_CTX_free(ctx);
  }
  X509_STORE_free(store);
  X509_free(cert);
  X509_free(ca);
  // The key is its owner's only.
  EXPECT_EQ(std::filesystem::status(files_.key_file).permissions() & std::filesystem::perms::all,
            std::filesystem::perms::owner_read | std::filesystem::perms::owner_write);
}

TEST_F(TlsTest, ValidateTlsAcceptsAMatchingPairAndNoFilesAtAll) {
  EXPECT_TRUE(ValidateTls(TlsOptions{}).ok());
  EXPECT_FALSE(TlsEnabled(TlsOptions{}));
  EXPECT_TRUE(ValidateTls(Options()).ok());
  EXPECT_TRUE(ValidateTls({.ca_file = files_.ca_file}).ok());  // a client of the CA only
}

TEST_F(TlsTest, ValidateTlsNamesWhatIsWrong) {
  const ClusterCertificates other = Other("other");
  struct Case {
    TlsOptions options;
    const char* message;
  };
  const Case cases[] = {
      {{.cert_file = files_.cert_file}, "together"},
      {{.key_file = files_.key_file}, "together"},
      {{.cert_file = files_.cert_file, .key_file = other.key_file}, "is not the key of"},
      {{.cert_file = dir_ + "/missing.crt", .key_file = files_.key_file}, "cannot be read"},
      {{.cert_file = files_.key_file, .key_file = files_.key_file}, "no PEM certificate"},
      {{.cert_file = files_.cert_file, .key_file = files_.cert_file}, "no unencrypted PEM"},
      {{.ca_file = files_.key_file}, "no PEM certificate"},
      {{.ca_file = files_.ca_file, .reload_period = absl::Milliseconds(500)}, "at least 1 s"},
  };
  for (const Case& c : cases) {
    const absl::Status s = ValidateTls(c.options);
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << c.message;
    EXPECT_NE(s.message().find(c.message), std::string::npos) << s.message();
  }
}

TEST_F(TlsTest, ServerCredentialsNeedACertificate) {
  EXPECT_TRUE(ServerCredentialsFor(TlsOptions{}, ClientAuth::kClusterPeers).ok());
  EXPECT_EQ(ServerCredentialsFor({.ca_file = files_.ca_file}, ClientAuth::kClusterPeers)
                .status()
                .code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(ServerCredentialsFor(Options(), ClientAuth::kClusterPeers).ok());
  absl::StatusOr<ChannelSecurity> none = ChannelSecurityFor(TlsOptions{});
  ASSERT_TRUE(none.ok());
  EXPECT_EQ(none->credentials, nullptr);
  absl::StatusOr<ChannelSecurity> tls = ChannelSecurityFor(Options());
  ASSERT_TRUE(tls.ok());
  EXPECT_NE(tls->credentials, nullptr);
}

TEST_F(TlsTest, TheServerContextLoadsNewFilesAndKeepsTheOldOnesWhenTheyDoNotLoad) {
  absl::StatusOr<std::unique_ptr<ServerTlsContext>> context =
      ServerTlsContext::Create(Options(), ClientAuth::kAnyClient);
  ASSERT_TRUE(context.ok()) << context.status();
  ServerTlsContext& tls = **context;
  EXPECT_EQ(tls.loads(), 1);
  EXPECT_TRUE(tls.ReloadIfChanged().ok());
  EXPECT_EQ(tls.loads(), 1);  // nothing changed

  // A new pair, written over the old files: loaded.
  const ClusterCertificates next = Other("next");
  std::filesystem::copy_file(next.cert_file, files_.cert_file,
                             std::filesystem::copy_options::overwrite_existing);
  std::filesystem::copy_file(next.key_file, files_.key_file,
                             std::filesystem::copy_options::overwrite_existing);
  EXPECT_TRUE(tls.ReloadIfChanged().ok());
  EXPECT_EQ(tls.loads(), 2);

  // A key that is not the certificate's: refused, the last good pair stays, and the same bad
  // content is not tried again.
  const ClusterCertificates bad = Other("bad");
  std::filesystem::copy_file(bad.key_file, files_.key_file,
                             std::filesystem::copy_options::overwrite_existing);
  EXPECT_EQ(tls.ReloadIfChanged().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(tls.ReloadIfChanged().ok());
  EXPECT_EQ(tls.loads(), 2);
  SSL* ssl = tls.NewSsl();
  ASSERT_NE(ssl, nullptr);
  X509* served = SSL_get_certificate(ssl);  // owned by the SSL
  X509* expected = ReadCert(next.cert_file);
  ASSERT_NE(served, nullptr);
  EXPECT_EQ(X509_cmp(served, expected), 0);
  X509_free(expected);
  SSL_free(ssl);
}

TEST_F(TlsTest, TheServerContextRefusesAMissingPair) {
  EXPECT_EQ(ServerTlsContext::Create({.ca_file = files_.ca_file}, ClientAuth::kAnyClient)
                .status()
                .code(),
            absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace tandem
