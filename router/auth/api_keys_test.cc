#include "router/auth/api_keys.h"

#include <string>

#include "absl/status/status.h"
#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace tandem::auth {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

// SHA-256("test"), as published (e.g. by `printf test | sha256sum`): the digest is checked against
// a value no code here computed.
constexpr char kTestDigest[] = "9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08";

std::string Line(absl::string_view tenant, absl::string_view hex, absl::string_view rest = "") {
  return absl::StrCat(tenant, " sha256:", hex, rest.empty() ? "" : " ", rest);
}

TEST(DigestOf, IsSha256) {
  const KeyDigest d = DigestOf("test");
  EXPECT_EQ(absl::BytesToHexString(absl::string_view(reinterpret_cast<const char*>(d.data()),
                                                     d.size())),
            kTestDigest);
}

TEST(ParseApiKeys, ReadsTenantsDigestsLimitsAndSkipsComments) {
  const std::string text = absl::StrCat(
      "# tenants\n\n", Line("team-a", kTestDigest, "rps=2.5 concurrency=3  # the first\n"),
      "  ", Line("b_2.x", std::string(64, 'A')), "\r\n", Line("c", std::string(64, '0'), "rps=7"));
  absl::StatusOr<std::vector<ApiKeyEntry>> entries = ParseApiKeys(text);
  ASSERT_TRUE(entries.ok()) << entries.status();
  ASSERT_EQ(entries->size(), 3u);
  EXPECT_EQ((*entries)[0].tenant, "team-a");
  EXPECT_EQ((*entries)[0].line, 3);
  EXPECT_EQ((*entries)[0].digest, DigestOf("test"));
  EXPECT_EQ((*entries)[0].limits, (TenantLimits{.rps = 2.5, .concurrency = 3}));
  EXPECT_EQ((*entries)[1].tenant, "b_2.x");
  EXPECT_EQ((*entries)[1].digest[0], 0xAA);
  EXPECT_EQ((*entries)[1].limits, TenantLimits{});
  EXPECT_EQ((*entries)[2].line, 5);
  EXPECT_EQ((*entries)[2].limits, TenantLimits{.rps = 7});
}

TEST(ParseApiKeys, EmptyFileHasNoKeys) {
  absl::StatusOr<std::vector<ApiKeyEntry>> entries = ParseApiKeys("# nobody yet\n\n");
  ASSERT_TRUE(entries.ok());
  EXPECT_TRUE(entries->empty());
}

TEST(ParseApiKeys, RefusesMalformedLinesNamingTheLineNotTheSecret) {
  const std::string ok = Line("a", kTestDigest);
  const std::string hex2 = std::string(64, 'b');
  struct Case {
    std::string text;
    int line;
    std::string says;
  };
  const Case cases[] = {
      {"bad!name sha256:" + hex2, 1, "tenant name"},
      {absl::StrCat(ok, "\nlonely"), 2, "expected"},
      {"x sha1:" + hex2, 1, "sha256:"},
      {"x sha256:" + std::string(63, 'b'), 1, "64 hex"},
      {"x sha256:" + std::string(63, 'b') + "g", 1, "64 hex"},
      {"x sk-plaintextkey", 1, "sha256:"},
      {Line("x", hex2, "rps=0"), 1, "rps="},
      {Line("x", hex2, "rps=-1"), 1, "rps="},
      {Line("x", hex2, "rps=inf"), 1, "rps="},
      {Line("x", hex2, "rps=fast"), 1, "rps="},
      {Line("x", hex2, "rps=1 rps=2"), 1, "rps="},
      {Line("x", hex2, "concurrency=0"), 1, "concurrency="},
      {Line("x", hex2, "concurrency=1.5"), 1, "concurrency="},
      {Line("x", hex2, "tdm-pasted-key-here"), 1, "unknown field 3"},
      {absl::StrCat(ok, "\n", Line("b", kTestDigest)), 2, "on line 1"},
      {absl::StrCat(Line("a", hex2, "rps=1"), "\n#\n", Line("a", kTestDigest, "rps=2")), 3,
       "other limits on line 1"},
      {absl::StrCat(Line("a", hex2, "rps=1"), "\n", Line("a", kTestDigest)), 2, "other limits"},
  };
  for (const Case& c : cases) {
    absl::StatusOr<std::vector<ApiKeyEntry>> entries = ParseApiKeys(c.text);
    ASSERT_FALSE(entries.ok()) << c.text;
    EXPECT_EQ(entries.status().code(), absl::StatusCode::kInvalidArgument) << c.text;
    EXPECT_THAT(entries.status().message(), HasSubstr(absl::StrCat("line ", c.line, ":")))
        << c.text;
    EXPECT_THAT(entries.status().message(), HasSubstr(c.says)) << c.text;
    EXPECT_THAT(entries.status().message(), Not(HasSubstr("tdm-pasted")));
    EXPECT_THAT(entries.status().message(), Not(HasSubstr(hex2)));
    EXPECT_THAT(entries.status().message(), Not(HasSubstr(kTestDigest)));
  }
}

TEST(ParseApiKeys, ATenantMayHaveSeveralKeysWithTheSameLimits) {
  absl::StatusOr<std::vector<ApiKeyEntry>> entries = ParseApiKeys(absl::StrCat(
      Line("a", kTestDigest, "concurrency=2"), "\n", Line("a", std::string(64, 'c'),
                                                          "concurrency=2")));
  ASSERT_TRUE(entries.ok()) << entries.status();
  EXPECT_EQ(entries->size(), 2u);
}

TEST(KeyTable, FindsEachEntryComparingThemAll) {
  std::vector<ApiKeyEntry> entries;
  for (int i = 0; i < 5; ++i) {
    entries.push_back({.tenant = absl::StrCat("t", i), .digest = DigestOf(absl::StrCat("k", i))});
  }
  const KeyTable table(entries);
  for (int i = 0; i < 5; ++i) {
    int compared = 0;
    const ApiKeyEntry* found = table.Find(DigestOf(absl::StrCat("k", i)), &compared);
    ASSERT_NE(found, nullptr);
    EXPECT_EQ(found->tenant, absl::StrCat("t", i));
    // No early exit at the match: the first entry costs as much as the last.
    EXPECT_EQ(compared, 5);
  }
  // A digest equal to an entry's but for its last byte matches nothing, after every compare.
  KeyDigest near = DigestOf("k2");
  near[31] ^= 1;
  int compared = 0;
  EXPECT_EQ(table.Find(near, &compared), nullptr);
  EXPECT_EQ(compared, 5);
  EXPECT_EQ(table.Find(DigestOf("k5")), nullptr);
  EXPECT_EQ(KeyTable({}).Find(DigestOf("k0")), nullptr);
}

TEST(NewApiKey, IsFreshBase64urlAndItsLineParsesBack) {
  absl::StatusOr<std::string> a = NewApiKey();
  absl::StatusOr<std::string> b = NewApiKey();
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_NE(*a, *b);
  ASSERT_TRUE(absl::StartsWith(*a, "tdm-"));
  EXPECT_EQ(a->size(), 4u + 43u);  // 32 bytes, unpadded base64url
  std::string raw;
  ASSERT_TRUE(absl::WebSafeBase64Unescape(a->substr(4), &raw));
  EXPECT_EQ(raw.size(), 32u);

  const std::string line = ApiKeyLine("team-a", *a, {.rps = 1.5, .concurrency = 4});
  EXPECT_THAT(line, Not(HasSubstr(*a)));
  absl::StatusOr<std::vector<ApiKeyEntry>> entries = ParseApiKeys(line);
  ASSERT_TRUE(entries.ok()) << entries.status() << " in " << line;
  ASSERT_EQ(entries->size(), 1u);
  EXPECT_EQ((*entries)[0].digest, DigestOf(*a));
  EXPECT_EQ((*entries)[0].limits, (TenantLimits{.rps = 1.5, .concurrency = 4}));
  EXPECT_EQ(ApiKeyLine("t", "test", {}), absl::StrCat("t sha256:", kTestDigest));
}

TEST(BearerKey, TakesTheBearerSchemeOnly) {
  EXPECT_EQ(BearerKey("Bearer abc"), "abc");
  EXPECT_EQ(BearerKey("bearer   abc "), "abc");
  EXPECT_EQ(BearerKey("BEARER\tabc"), "abc");
  EXPECT_EQ(BearerKey("Bearer"), std::nullopt);
  EXPECT_EQ(BearerKey("Bearer "), std::nullopt);
  EXPECT_EQ(BearerKey("Bearerabc"), std::nullopt);
  EXPECT_EQ(BearerKey("Basic YWxhZGRpbjpvcGVuc2VzYW1l"), std::nullopt);
  EXPECT_EQ(BearerKey(""), std::nullopt);
}

}  // namespace
}  // namespace tandem::auth
