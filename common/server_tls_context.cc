#include "common/server_tls_context.h"

#include <openssl/err.h>

#include <fstream>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "common/logging.h"

namespace tandem {
namespace {

// The whole content of `path`.
absl::StatusOr<std::string> ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::InvalidArgumentError(absl::StrCat("'", path, "' cannot be read"));
  std::ostringstream out;
  out << in.rdbuf();
  return out.str();
}

std::string OpenSslError() {
  const unsigned long code = ERR_get_error();  // NOLINT: OpenSSL's type
  ERR_clear_error();
  if (code == 0) return "unknown OpenSSL error";
  char text[256];
  ERR_error_string_n(code, text, sizeof(text));
  return text;
}

}  // namespace

ServerTlsContext::ServerTlsContext(const TlsOptions& options, ClientAuth client_auth)
    : options_(options), client_auth_(client_auth) {}

absl::StatusOr<std::unique_ptr<ServerTlsContext>> ServerTlsContext::Create(
    const TlsOptions& options, ClientAuth client_auth) {
  if (options.cert_file.empty() || options.key_file.empty()) {
    return absl::InvalidArgumentError(
        "a TLS server needs its certificate and key (--tls_cert and --tls_key)");
  }
  if (absl::Status s = ValidateTls(options); !s.ok()) return s;
  std::unique_ptr<ServerTlsContext> tls(new ServerTlsContext(options, client_auth));
  if (absl::Status s = tls->ReloadIfChanged(); !s.ok()) return s;
  tls->reload_ = std::make_unique<PeriodicThread>(
      PeriodicThread::Options{.period = options.reload_period},
      [raw = tls.get()] { raw->ReloadIfChanged().IgnoreError(); });
  return tls;
}

ServerTlsContext::~ServerTlsContext() { reload_.reset(); }

absl::Status ServerTlsContext::ReloadIfChanged() {
  const bool verify_clients =
      client_auth_ == ClientAuth::kClusterPeers && !options_.ca_file.empty();
  std::string content;
  for (const std::string* path :
       {&options_.cert_file, &options_.key_file, verify_clients ? &options_.ca_file : nullptr}) {
    if (path == nullptr) continue;
    absl::StatusOr<std::string> bytes = ReadFile(*path);
    if (!bytes.ok()) return bytes.status();
    absl::StrAppend(&content, bytes->size(), ":", *bytes);
  }
  {
    absl::MutexLock lock(&mu_);
    if (content == loaded_content_ || content == failed_content_) return absl::OkStatus();
  }
  // Built outside the lock: handshakes go on with the old context meanwhile.
  std::shared_ptr<SSL_CTX> context(SSL_CTX_new(TLS_server_method()), SSL_CTX_free);
  absl::Status status;
  if (context == nullptr) {
    status = absl::ResourceExhaustedError("OpenSSL made no context");
  } else if (SSL_CTX_set_min_proto_version(context.get(), TLS1_2_VERSION) != 1) {
    status = absl::InternalError(absl::StrCat("TLS 1.2 floor: ", OpenSslError()));
  } else if (SSL_CTX_use_certificate_chain_file(context.get(), options_.cert_file.c_str()) != 1) {
    status = absl::InvalidArgumentError(absl::StrCat("the TLS certificate '", options_.cert_file,
                                                     "': ", OpenSslError()));
  } else if (SSL_CTX_use_PrivateKey_file(context.get(), options_.key_file.c_str(),
                                         SSL_FILETYPE_PEM) != 1 ||
             SSL_CTX_check_private_key(context.get()) != 1) {
    status = absl::InvalidArgumentError(absl::StrCat(
        "the TLS key '", options_.key_file, "' (with its certificate): ", OpenSslError()));
  } else if (verify_clients) {
    if (SSL_CTX_load_verify_locations(context.get(), options_.ca_file.c_str(), nullptr) != 1) {
      status = absl::InvalidArgumentError(
          absl::StrCat("the TLS CA bundle '", options_.ca_file, "': ", OpenSslError()));
    } else {
      SSL_CTX_set_verify(context.get(), SSL_VERIFY_PEER | SSL_VERIFY_FAIL_IF_NO_PEER_CERT,
                         nullptr);
    }
  }
  absl::MutexLock lock(&mu_);
  if (!status.ok()) {
    failed_content_ = content;
    if (context_ != nullptr) {
      LOG(WARNING) << "TLS files changed but do not load; the previous certificate stays in use: "
                   << status.message();
    }
    return status;
  }
  context_ = std::move(context);
  loaded_content_ = std::move(content);
  failed_content_.clear();
  if (++loads_ > 1) LOG(INFO) << "TLS certificate reloaded from " << options_.cert_file;
  return absl::OkStatus();
}

SSL* ServerTlsContext::NewSsl() {
  absl::MutexLock lock(&mu_);
  return SSL_new(context_.get());  // holds its own reference to the context
}

int64_t ServerTlsContext::loads() const {
  absl::MutexLock lock(&mu_);
  return loads_;
}

}  // namespace tandem
