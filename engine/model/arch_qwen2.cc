// GGUF architecture "qwen2": the Llama layout plus biases on the Q, K and V projections
// (blk.N.attn_{q,k,v}.bias, required). RMSNorm eps defaults to 1e-6, RoPE base to 1e6.
#include "engine/model/gguf_architecture.h"

namespace tandem {
namespace {

constexpr LlamaFamilyTraits kQwen2Traits{
    .arch = "qwen2",
    .default_rms_norm_eps = 1e-6f,
    .default_rope_theta = 1000000.0f,
    .attention_bias = true,
    .qk_norm = false,
    .rope_neox = true,  // written unpermuted
};

absl::StatusOr<ModelConfig> Qwen2Config(const GgufFile& file) {
  return LlamaFamilyConfigFromGguf(file, kQwen2Traits);
}

}  // namespace

const GgufArchitecture& Qwen2Architecture() {
  static constexpr GgufArchitecture kArch{
      .name = "qwen2",
      .config_from_gguf = &Qwen2Config,
      .weights_from_gguf = &LlamaFamilyWeightsFromGguf,
  };
  return kArch;
}

}  // namespace tandem
