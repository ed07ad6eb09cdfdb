// Fuzzes the Hugging Face config.json reader (engine/model/hf_config.h): the input is the file's
// text. An accepted config must be one that ModelConfig's own validation accepts.
#include <cstddef>
#include <cstdint>

#include "absl/strings/string_view.h"
#include "engine/model/hf_config.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const absl::string_view text(reinterpret_cast<const char*>(data), size);
  (void)tandem::ModelConfigFromHfConfigJson(text, "config.json");
  return 0;
}
