#include "router/auth/api_keys.h"

#include <openssl/crypto.h>
#include <openssl/rand.h>
#include <openssl/sha.h>

#include <cmath>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/ascii.h"
#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"

namespace tandem::auth {
namespace {

constexpr absl::string_view kDigestPrefix = "sha256:";
constexpr absl::string_view kKeyPrefix = "tdm-";

std::string Hex(const KeyDigest& digest) {
  return absl::BytesToHexString(
      absl::string_view(reinterpret_cast<const char*>(digest.data()), digest.size()));
}

std::optional<KeyDigest> ParseDigest(absl::string_view text) {
  if (!absl::ConsumePrefix(&text, kDigestPrefix) || text.size() != 64) return std::nullopt;
  for (char c : text) {
    if (!absl::ascii_isxdigit(static_cast<unsigned char>(c))) return std::nullopt;
  }
  const std::string bytes = absl::HexStringToBytes(text);
  KeyDigest digest;
  std::copy(bytes.begin(), bytes.end(), digest.begin());
  return digest;
}

std::string LimitsText(const TenantLimits& limits) {
  std::string out;
  if (limits.rps.has_value()) absl::StrAppend(&out, " rps=", *limits.rps);
  if (limits.concurrency.has_value()) absl::StrAppend(&out, " concurrency=", *limits.concurrency);
  return out.empty() ? " no limits" : out;
}

}  // namespace

KeyDigest DigestOf(absl::string_view key) {
  KeyDigest digest;
  SHA256(reinterpret_cast<const unsigned char*>(key.data()), key.size(), digest.data());
  return digest;
}

absl::Status ValidateTenant(absl::string_view tenant) {
  const bool ok = !tenant.empty() && tenant.size() <= 64 &&
                  std::all_of(tenant.begin(), tenant.end(), [](char c) {
                    return absl::ascii_isalnum(static_cast<unsigned char>(c)) || c == '_' ||
                           c == '.' || c == '-';
                  });
  if (ok) return absl::OkStatus();
  return absl::InvalidArgumentError(
      "a tenant name is 1 to 64 characters of letters, digits, '_', '.' and '-'");
}

absl::StatusOr<std::vector<ApiKeyEntry>> ParseApiKeys(absl::string_view text) {
  std::vector<ApiKeyEntry> entries;
  absl::flat_hash_map<KeyDigest, int> digest_lines;
  absl::flat_hash_map<std::string, size_t> tenant_first;  // index of the tenant's first entry
  int number = 0;
  for (absl::string_view line : absl::StrSplit(text, '\n')) {
    ++number;
    auto error = [number](absl::string_view what) {
      return absl::InvalidArgumentError(absl::StrCat("API key file, line ", number, ": ", what));
    };
    if (const size_t hash = line.find('#'); hash != absl::string_view::npos) {
      line = line.substr(0, hash);
    }
    const std::vector<absl::string_view> fields =
        absl::StrSplit(line, absl::ByAnyChar(" \t\r"), absl::SkipEmpty());
    if (fields.empty()) continue;
    ApiKeyEntry entry;
    entry.line = number;
    entry.tenant = std::string(fields[0]);
    if (absl::Status s = ValidateTenant(entry.tenant); !s.ok()) return error(s.message());
    if (fields.size() < 2) return error("expected '<tenant> sha256:<64 hex digits> [limits]'");
    std::optional<KeyDigest> digest = ParseDigest(fields[1]);
    if (!digest.has_value()) {
      return error("the second field must be 'sha256:' and the 64 hex digits of the key's "
                   "SHA-256 (`tandem apikey` prints a key and its line)");
    }
    entry.digest = *digest;
    for (size_t i = 2; i < fields.size(); ++i) {
      absl::string_view value = fields[i];
      if (absl::ConsumePrefix(&value, "rps=")) {
        double rps = 0;
        if (entry.limits.rps.has_value() || !absl::SimpleAtod(value, &rps) ||
            !std::isfinite(rps) || rps <= 0) {
          return error("rps= takes one positive number (requests per second)");
        }
        entry.limits.rps = rps;
      } else if (absl::ConsumePrefix(&value, "concurrency=")) {
        int64_t concurrency = 0;
        if (entry.limits.concurrency.has_value() || !absl::SimpleAtoi(value, &concurrency) ||
            concurrency < 1) {
          return error("concurrency= takes one integer >= 1 (requests in flight at once)");
        }
        entry.limits.concurrency = concurrency;
      } else {
        // The field may be a key pasted in the wrong place: do not echo it.
        return error(absl::StrCat("unknown field ", i + 1, ": a line's fields after the digest "
                                  "are rps=<number> and concurrency=<int>"));
      }
    }
    if (auto [it, added] = digest_lines.emplace(entry.digest, number); !added) {
      return error(absl::StrCat("the same key's digest is on line ", it->second));
    }
    if (auto [it, added] = tenant_first.emplace(entry.tenant, entries.size()); !added) {
      const ApiKeyEntry& first = entries[it->second];
      if (!(first.limits == entry.limits)) {
        return error(absl::StrCat("tenant '", entry.tenant, "' has other limits on line ",
                                  first.line, " (", LimitsText(first.limits).substr(1),
                                  "): a tenant's lines give the same limits"));
      }
    }
    entries.push_back(std::move(entry));
  }
  return entries;
}

const ApiKeyEntry* KeyTable::Find(const KeyDigest& digest, int* compared) const {
  const ApiKeyEntry* found = nullptr;
  int n = 0;
  for (const ApiKeyEntry& entry : entries_) {
    // No branch on the outcome but a conditional move of a pointer; every entry is compared.
    const bool equal = CRYPTO_memcmp(entry.digest.data(), digest.data(), digest.size()) == 0;
    found = equal ? &entry : found;
    ++n;
  }
  if (compared != nullptr) *compared = n;
  return found;
}

absl::StatusOr<std::string> NewApiKey() {
  unsigned char bytes[32];
  if (RAND_bytes(bytes, sizeof(bytes)) != 1) {
    return absl::InternalError("OpenSSL's RAND_bytes failed: no key was made");
  }
  std::string key = absl::StrCat(
      kKeyPrefix,
      absl::WebSafeBase64Escape(absl::string_view(reinterpret_cast<char*>(bytes), sizeof(bytes))));
  OPENSSL_cleanse(bytes, sizeof(bytes));
  return key;
}

std::string ApiKeyLine(absl::string_view tenant, absl::string_view key,
                       const TenantLimits& limits) {
  std::string line = absl::StrCat(tenant, " ", kDigestPrefix, Hex(DigestOf(key)));
  if (limits.rps.has_value() || limits.concurrency.has_value()) {
    absl::StrAppend(&line, LimitsText(limits));
  }
  return line;
}

std::optional<absl::string_view> BearerKey(absl::string_view authorization) {
  absl::string_view rest = absl::StripAsciiWhitespace(authorization);
  constexpr absl::string_view kScheme = "bearer";
  if (rest.size() <= kScheme.size() ||
      !absl::EqualsIgnoreCase(rest.substr(0, kScheme.size()), kScheme) ||
      (rest[kScheme.size()] != ' ' && rest[kScheme.size()] != '\t')) {
    return std::nullopt;
  }
  rest = absl::StripLeadingAsciiWhitespace(rest.substr(kScheme.size()));
  if (rest.empty()) return std::nullopt;
  return rest;
}

}  // namespace tandem::auth
