// GGUF architecture "llama": Llama 2/3, SmolLM/SmolLM2, TinyLlama and Mistral (llama.cpp writes
// all of them as "llama"). No attention biases; output.weight absent means tied embeddings.
// Llama 3.1's RoPE scaling comes as `rope_freqs.weight` (the converter's form) or as
// `llama.rope.scaling.*` metadata; Mistral's sliding window as `llama.attention.sliding_window`
// (every layer; llama.cpp's converter does not write it and llama.cpp ignores it for "llama").
#include "engine/model/gguf_architecture.h"

namespace tandem {
namespace {

constexpr LlamaFamilyTraits kLlamaTraits{
    .arch = "llama",
    .default_rms_norm_eps = 1e-5f,
    .default_rope_theta = 10000.0f,
    .attention_bias = false,
    .qk_norm = false,
    .rope_neox = false,  // llama.cpp's converter permutes Q/K rows for interleaved pairs
};

absl::StatusOr<ModelConfig> LlamaConfig(const GgufFile& file) {
  return LlamaFamilyConfigFromGguf(file, kLlamaTraits);
}

}  // namespace

const GgufArchitecture& LlamaArchitecture() {
  static constexpr GgufArchitecture kArch{
      .name = "llama",
      .config_from_gguf = &LlamaConfig,
      .weights_from_gguf = &LlamaFamilyWeightsFromGguf,
  };
  return kArch;
}

}  // namespace tandem
