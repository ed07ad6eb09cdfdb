// The TLS flags every binary shares (--tls_cert, --tls_key, --tls_ca, --tls_reload_s,
// --tls_server_name; each also read from its TANDEM_* variable, common/flags.h), read into
// TlsOptions (common/tls.h). Compiled into the binaries only (tls_flags.cc is in their SRCS):
// libraries take TlsOptions, never flags.
#ifndef TANDEM_COMMON_TLS_FLAGS_H_
#define TANDEM_COMMON_TLS_FLAGS_H_

#include "absl/status/statusor.h"
#include "common/tls.h"

namespace tandem {

// The TLS flags, validated (ValidateTls); INVALID_ARGUMENT naming the flag or file at fault.
// Call after ParseFlagsWithEnvironment.
absl::StatusOr<TlsOptions> TlsOptionsFromFlags();

}  // namespace tandem

#endif  // TANDEM_COMMON_TLS_FLAGS_H_
