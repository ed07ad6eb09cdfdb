// Fuzzes the tokenizer.json reader (engine/tokenizer/hf_tokenizer.h) and the tokenizer it makes.
// The input is tokenizer.json, then optionally a NUL byte and tokenizer_config.json (JSON text
// holds no raw NUL). A tokenizer that is accepted encodes a fixed text with and without special
// tokens, and decodes the ids and every id around the vocabulary's ends.
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/string_view.h"
#include "engine/tokenizer/hf_tokenizer.h"
#include "engine/tokenizer/tokenizer.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const absl::string_view input(reinterpret_cast<const char*>(data), size);
  absl::string_view tokenizer_json = input;
  absl::string_view config_json;
  if (const size_t nul = input.find('\0'); nul != absl::string_view::npos) {
    tokenizer_json = input.substr(0, nul);
    config_json = input.substr(nul + 1);
  }
  auto tokenizer_data = tandem::TokenizerDataFromHfJson(tokenizer_json, config_json, "fuzz");
  if (!tokenizer_data.ok()) return 0;
  auto tokenizer = tandem::Tokenizer::Create(*std::move(tokenizer_data));
  if (!tokenizer.ok()) return 0;
  const tandem::Tokenizer& t = **tokenizer;
  for (bool add_special : {false, true}) {
    const std::vector<int32_t> ids =
        t.Encode("Hi <|im_start|>user\n héllo  wörld 123 \xe6\x97\xa5\xff</s><s>",
                 {.add_special = add_special, .parse_special = add_special});
    (void)t.Decode(ids);
    (void)t.Decode(ids, {.skip_special = true});
  }
  const std::vector<int32_t> edges = {-1, 0, 1, t.vocab_size() - 1, t.vocab_size()};
  (void)t.Decode(edges);
  for (int32_t id : edges) (void)t.TokenBytes(id);
  return 0;
}
