// Fuzzes the GGUF reader (engine/model/gguf.h) and what reads a parsed file: every metadata value
// through its accessors, the model config (ModelConfigFromGguf), the tokenizer
// (TokenizerFromGguf) with a short encode/decode, the chat template it names, and the weights
// (LoadGgufModel). The input is a whole file.
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/string_view.h"
#include "common/logging.h"
#include "engine/model/gguf.h"
#include "engine/model/model_loader.h"
#include "engine/tokenizer/chat_template.h"
#include "engine/tokenizer/gguf_tokenizer.h"
#include "engine/tokenizer/tokenizer.h"

namespace {

// Touches every scalar and array element (arrays of arrays included), as a dump would.
void Walk(const tandem::GgufValue& value, int depth) {
  (void)value.AsInt64();
  (void)value.AsUint64();
  (void)value.AsFloat64();
  (void)value.AsBool();
  (void)value.AsString();
  if (depth > 8) return;
  const int64_t n = value.size();
  for (int64_t i = 0; i < n && i < 64; ++i) Walk(value.element(i), depth + 1);
  if (n > 64) Walk(value.element(n - 1), depth + 1);
}

}  // namespace

// A file whose chat template does not parse logs a warning (chat_template.cc), which most mutated
// files do: printing it on every run would slow the fuzzer down and bury its own output. Only
// errors are printed.
extern "C" int LLVMFuzzerInitialize(int* /*argc*/, char*** /*argv*/) {
  tandem::SetLogOptions({.min_severity = tandem::LogSeverity::kError});
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const absl::string_view bytes(reinterpret_cast<const char*>(data), size);
  auto file = tandem::GgufFile::FromBytes(bytes, "fuzz.gguf");
  if (!file.ok()) return 0;
  for (const tandem::GgufKeyValue& kv : (*file)->metadata()) {
    Walk(kv.value, 0);
    (void)(*file)->GetStringArray(kv.key);
    (void)(*file)->GetFloat32Array(kv.key);
    (void)(*file)->GetInt32Array(kv.key);
    (void)(*file)->GetUint32(kv.key);
    (void)(*file)->GetFloat32(kv.key);
  }
  for (const tandem::GgufTensor& tensor : (*file)->tensors()) {
    (void)tensor.elements();
    (void)(*file)->FindTensor(tensor.name);
  }
  (void)tandem::ModelConfigFromGguf(**file);
  auto tokenizer = tandem::TokenizerFromGguf(**file);
  if (tokenizer.ok()) {
    const std::vector<int32_t> ids = (*tokenizer)->Encode("Hello, world! <s> 日本 \xff");
    (void)(*tokenizer)->Decode(ids);
    auto chat = tandem::ChatTemplate::ForModel(**tokenizer);
    if (chat.ok()) {
      tandem::ChatTemplate::RenderOptions options = tandem::ChatTemplate::OptionsFor(**tokenizer);
      options.limits.max_steps = 100'000;
      options.limits.max_output_bytes = 1 << 20;
      (void)chat->Render({{.role = "user", .content = "Hi"}}, options);
    }
  }
  (void)tandem::LoadGgufModel(*std::move(file));
  return 0;
}
