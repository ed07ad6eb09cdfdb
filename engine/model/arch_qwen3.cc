// GGUF architecture "qwen3": the Llama layout with each head of Q and of K RMS-normalized before
// RoPE (blk.N.attn_q_norm.weight and blk.N.attn_k_norm.weight, {head_dim}, required), no attention
// biases, head_dim usually set apart from hidden / heads (attention.key_length). RMSNorm eps
// defaults to 1e-6, RoPE base to 1e6; Q/K rows are written unpermuted (NeoX pairs).
#include "engine/model/gguf_architecture.h"

namespace tandem {
namespace {

constexpr LlamaFamilyTraits kQwen3Traits{
    .arch = "qwen3",
    .default_rms_norm_eps = 1e-6f,
    .default_rope_theta = 1000000.0f,
    .attention_bias = false,
    .qk_norm = true,
    .rope_neox = true,
};

absl::StatusOr<ModelConfig> Qwen3Config(const GgufFile& file) {
  return LlamaFamilyConfigFromGguf(file, kQwen3Traits);
}

}  // namespace

const GgufArchitecture& Qwen3Architecture() {
  static constexpr GgufArchitecture kArch{
      .name = "qwen3",
      .config_from_gguf = &Qwen3Config,
      .weights_from_gguf = &LlamaFamilyWeightsFromGguf,
  };
  return kArch;
}

}  // namespace tandem
