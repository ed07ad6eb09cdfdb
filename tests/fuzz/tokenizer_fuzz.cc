// Fuzzes tokenizer encode and decode on arbitrary bytes and ids (engine/tokenizer/tokenizer.h,
// streaming_detokenizer.h) with three tokenizers: the default model's (byte-level BPE, 49152
// tokens, read from <source>/models/ as the tests do), a small hand-made byte-level BPE and a
// small SentencePiece BPE with byte fallback (test_vocab.h). The input's first byte picks the
// tokenizer and the options; the rest is encoded as text and, read as little-endian int32s
// (any value, in range or not), decoded at once and token by token.
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/string_view.h"
#include "engine/model/gguf.h"
#include "engine/tokenizer/gguf_tokenizer.h"
#include "engine/tokenizer/streaming_detokenizer.h"
#include "engine/tokenizer/test_vocab.h"
#include "engine/tokenizer/tokenizer.h"

namespace {

std::unique_ptr<tandem::Tokenizer> Must(absl::StatusOr<std::unique_ptr<tandem::Tokenizer>> t,
                                        const char* what) {
  if (!t.ok()) {
    std::fprintf(stderr, "tokenizer_fuzz: %s: %s\n", what, t.status().ToString().c_str());
    std::abort();
  }
  return *std::move(t);
}

struct Tokenizers {
  std::unique_ptr<tandem::Tokenizer> all[3];
};

const Tokenizers& Get() {
  static const Tokenizers* tokenizers = [] {
    auto* t = new Tokenizers;
    const std::string path = std::string(TANDEM_SOURCE_DIR) + "/models/SmolLM2-135M-Instruct.Q4_1.gguf";
    auto gguf = tandem::GgufFile::Open(path);
    if (!gguf.ok()) {
      std::fprintf(stderr, "tokenizer_fuzz: the default model is needed (scripts/setup.sh): %s\n",
                   gguf.status().ToString().c_str());
      std::abort();
    }
    t->all[0] = Must(tandem::TokenizerFromGguf(**gguf), "default model");
    t->all[1] = Must(tandem::Tokenizer::Create(tandem::testing::ByteLevelVocab(
                         {{"h", "e"}, {"l", "l"}, {"he", "ll"}, {" ", "w"}, {"o", "r"}},
                         {"<|im_start|>", "<|im_end|>"})),
                     "byte-level");
    t->all[2] = Must(tandem::Tokenizer::Create(tandem::testing::SentencePieceVocab(
                         {{"▁", -1}, {"▁h", -2}, {"el", -3}, {"lo", -4}, {"▁hel", -5}})),
                     "sentencepiece");
    return t;
  }();
  return *tokenizers;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const uint8_t flags = data[0];
  const tandem::Tokenizer& t = *Get().all[(flags & 3) % 3];
  const absl::string_view text(reinterpret_cast<const char*>(data + 1), size - 1);
  const tandem::EncodeOptions encode{.add_special = (flags & 4) != 0,
                                     .parse_special = (flags & 8) != 0};
  const tandem::DecodeOptions decode{.skip_special = (flags & 16) != 0};

  const std::vector<int32_t> ids = t.Encode(text, encode);
  for (int32_t id : ids) {
    if (id < 0 || id >= t.vocab_size()) std::abort();  // Encode makes only real ids
  }
  (void)t.Decode(ids, decode);

  std::vector<int32_t> arbitrary((size - 1) / 4);
  if (!arbitrary.empty()) std::memcpy(arbitrary.data(), data + 1, arbitrary.size() * 4);
  (void)t.Decode(arbitrary, decode);
  tandem::StreamingDetokenizer detokenizer(t, decode);
  for (int32_t id : arbitrary) {
    (void)detokenizer.Add(id);
    (void)t.TokenBytes(id, decode);
    (void)t.IsControl(id);
  }
  (void)detokenizer.Finish();
  return 0;
}
