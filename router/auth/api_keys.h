// API keys of the router's tenants: the key file's format, the keys' digests, and a table that
// finds a presented key's tenant. Pure: no I/O but the CSPRNG of NewApiKey (docs/security.md).
//
// The key file has one key per line; '#' starts a comment, blank lines are skipped:
//
//   # <tenant> sha256:<64 hex digits of SHA-256(key)> [rps=<number>] [concurrency=<int>]
//   team-a sha256:9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08 rps=5
//
// A tenant may have several lines (a key being rotated: the old and the new one side by side);
// its limits are the tenant's, so every line of a tenant gives the same ones. Keys are never
// stored, only their digests, and nothing here prints a key.
#ifndef TANDEM_ROUTER_AUTH_API_KEYS_H_
#define TANDEM_ROUTER_AUTH_API_KEYS_H_

#include <array>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace tandem::auth {

// SHA-256 of a key's bytes.
using KeyDigest = std::array<uint8_t, 32>;
KeyDigest DigestOf(absl::string_view key);

// A tenant's limits; nullopt: none.
struct TenantLimits {
  // Requests per second, > 0: a token bucket refilled at this rate, holding max(1, rps).
  std::optional<double> rps = std::nullopt;
  // Requests in flight at once, >= 1.
  std::optional<int64_t> concurrency = std::nullopt;

  bool operator==(const TenantLimits&) const = default;
};

// One line of the key file.
struct ApiKeyEntry {
  std::string tenant;  // [A-Za-z0-9_.-]{1,64}: a metric label and part of error messages
  KeyDigest digest{};
  TenantLimits limits = {};
  int line = 0;  // 1-based line of the file
};

// The entries of a key file's text, in file order. INVALID_ARGUMENT naming the line (and never
// the rest of its text, which holds a digest) when a line is malformed: an unknown field, a
// digest that is not 64 hex digits, a limit out of range, a digest given twice, or a tenant whose
// lines disagree on its limits.
absl::StatusOr<std::vector<ApiKeyEntry>> ParseApiKeys(absl::string_view text);

// The entries of a parsed key file, looked up by the digest of a presented key. Immutable, so
// thread-safe.
class KeyTable {
 public:
  explicit KeyTable(std::vector<ApiKeyEntry> entries) : entries_(std::move(entries)) {}

  // The entry whose digest equals `digest`, or null. Compares with every entry in constant time
  // (CRYPTO_memcmp, no early exit), so how long it takes says nothing of which entry, if any,
  // matched or how much of a digest did. `compared` (optional) receives how many entries were
  // compared, for tests. The pointer lives as long as the table.
  const ApiKeyEntry* Find(const KeyDigest& digest, int* compared = nullptr) const;

  const std::vector<ApiKeyEntry>& entries() const { return entries_; }

 private:
  std::vector<ApiKeyEntry> entries_;
};

// A fresh key: "tdm-" and 43 characters of base64url, 256 bits from OpenSSL's CSPRNG
// (RAND_bytes). INTERNAL when the CSPRNG fails.
absl::StatusOr<std::string> NewApiKey();

// The key file's line for `key` of `tenant`: "<tenant> sha256:<hex> [rps=..] [concurrency=..]".
std::string ApiKeyLine(absl::string_view tenant, absl::string_view key, const TenantLimits& limits);

// INVALID_ARGUMENT unless `tenant` is a valid tenant name.
absl::Status ValidateTenant(absl::string_view tenant);

// The key of an "authorization" value "Bearer <key>" (the scheme case-insensitive, as RFC 6750
// and RFC 9110 have it), or nullopt when it has another form.
std::optional<absl::string_view> BearerKey(absl::string_view authorization);

}  // namespace tandem::auth

#endif  // TANDEM_ROUTER_AUTH_API_KEYS_H_
