// What TokenizerDataFromHfJson refuses. What it accepts is checked against Hugging Face
// tokenizers in tests/tokenizer/; these are the malformed files that need no reference.
#include "engine/tokenizer/hf_tokenizer.h"

#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"

namespace tandem {
namespace {

using ::nlohmann::json;
using ::testing::HasSubstr;

// A byte-level BPE tokenizer.json: vocab a=0, b=1, ab=2, the merge "a b", and <|end|> added as 3.
json TinyTokenizerJson() {
  return {{"model",
           {{"type", "BPE"}, {"vocab", {{"a", 0}, {"b", 1}, {"ab", 2}}}, {"merges", {"a b"}}}},
          {"added_tokens", {{{"id", 3}, {"content", "<|end|>"}, {"special", true}}}},
          {"pre_tokenizer", {{"type", "ByteLevel"}}},
          {"decoder", {{"type", "ByteLevel"}}}};
}

// An id past the file's number of tokens cannot be dense; it is refused before the vocabulary
// is sized by it (the hf_tokenizer fuzz target's finding: an id of 264 million asked for 8 GB).
TEST(HfTokenizerTest, AnIdPastTheNumberOfTokensIsRefusedBeforeAllocating) {
  absl::StatusOr<TokenizerData> ok = TokenizerDataFromHfJson(TinyTokenizerJson().dump(), "", "t");
  ASSERT_TRUE(ok.ok()) << ok.status();
  EXPECT_EQ(ok->tokens.size(), 4u);

  json vocab_id = TinyTokenizerJson();
  vocab_id["model"]["vocab"]["ab"] = (int64_t{1} << 30) - 1;
  json added_id = TinyTokenizerJson();
  added_id["added_tokens"][0]["id"] = (int64_t{1} << 30) - 1;
  json gap = TinyTokenizerJson();  // 4 entries, the largest id 4: id 3 has no token
  gap["added_tokens"][0]["id"] = 4;
  for (const json& j : {vocab_id, added_id, gap}) {
    const absl::Status s = TokenizerDataFromHfJson(j.dump(), "", "t").status();
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
    EXPECT_THAT(s.message(), HasSubstr("but there are only 4 tokens"));
  }
}

}  // namespace
}  // namespace tandem
