// GGUF architecture "gemma": Gemma 1 (2B, 7B). The Llama layout with NeoX RoPE pairs, no biases,
// head_dim from attention.key_length (256), and three changes: the token embeddings are scaled by
// sqrt(hidden_size), the FFN is GELU-gated (tanh approximation) instead of SiLU-gated, and the
// output reuses token_embd. Gemma's RMSNorm multiplies by (1 + w); llama.cpp's converter stores
// w + 1, so the norm weights in a GGUF are used as they are, like Llama's.
#include <cmath>

#include "common/status_macros.h"
#include "engine/model/gguf_architecture.h"

namespace tandem {

void ApplyGemmaCommon(ModelConfig* c) {
  c->embedding_scale = std::sqrt(static_cast<float>(c->hidden_size));
  c->ffn_activation = ModelConfig::Activation::kGeluTanh;
  c->tie_word_embeddings = true;
}

namespace {

constexpr LlamaFamilyTraits kGemmaTraits{
    .arch = "gemma",
    .default_rms_norm_eps = 1e-6f,
    .default_rope_theta = 10000.0f,
    .attention_bias = false,
    .qk_norm = false,
    .rope_neox = true,
};

absl::StatusOr<ModelConfig> GemmaConfig(const GgufFile& file) {
  ASSIGN_OR_RETURN(ModelConfig c, LlamaFamilyConfigFromGguf(file, kGemmaTraits));
  ApplyGemmaCommon(&c);
  return c;
}

}  // namespace

const GgufArchitecture& GemmaArchitecture() {
  static constexpr GgufArchitecture kArch{
      .name = "gemma",
      .config_from_gguf = &GemmaConfig,
      .weights_from_gguf = &LlamaFamilyWeightsFromGguf,
  };
  return kArch;
}

}  // namespace tandem
