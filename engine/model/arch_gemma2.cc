// GGUF architecture "gemma2": Gemma 2 (2B, 9B, 27B). Gemma 1's changes (arch_gemma.cc) and:
//   - sandwich norms: blk.N.post_attention_norm.weight and blk.N.post_ffw_norm.weight ({H}, +1
//     folded in by the converter) normalize the attention and FFN outputs before each residual
//     add;
//   - soft-capped attention scores and logits, cap * tanh(x / cap):
//     gemma2.attn_logit_softcapping (50 when absent) and gemma2.final_logit_softcapping (30);
//   - sliding-window attention on every other layer, from layer 0 (gemma2.attention.sliding_window,
//     4096 when absent; gemma2.attention.sliding_window_pattern may give another period or one
//     bool per layer);
//   - q·k scaled by 1 / sqrt(query_pre_attn_scalar), which the file does not state: llama.cpp
//     takes head_dim, except for the 27B model (46 layers), where it is hidden / heads (144), and
//     so do we.
// A different RoPE base for the windowed layers (gemma2.rope.freq_base_swa) is refused.
#include <cmath>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "engine/model/gguf_architecture.h"

namespace tandem {
namespace {

constexpr LlamaFamilyTraits kGemma2Traits{
    .arch = "gemma2",
    .default_rms_norm_eps = 1e-6f,
    .default_rope_theta = 10000.0f,
    .attention_bias = false,
    .qk_norm = false,
    .rope_neox = true,
    .sliding_window_period = 2,
    .default_sliding_window = 4096,
    .post_norms = true,
};

constexpr int64_t kGemma2_27bLayers = 46;

absl::StatusOr<ModelConfig> Gemma2Config(const GgufFile& file) {
  ASSIGN_OR_RETURN(ModelConfig c, LlamaFamilyConfigFromGguf(file, kGemma2Traits));
  ApplyGemmaCommon(&c);
  auto optional_float = [&](const char* key, float fallback) -> absl::StatusOr<float> {
    if (!file.Has(key)) return fallback;
    return file.GetFloat32(key);
  };
  ASSIGN_OR_RETURN(c.attn_logit_softcap, optional_float("gemma2.attn_logit_softcapping", 50.0f));
  ASSIGN_OR_RETURN(c.final_logit_softcap,
                   optional_float("gemma2.final_logit_softcapping", 30.0f));
  ASSIGN_OR_RETURN(const float swa_base, optional_float("gemma2.rope.freq_base_swa", c.rope_theta));
  if (swa_base != c.rope_theta) {
    return absl::UnimplementedError(absl::StrCat(
        file.path(), ": metadata key 'gemma2.rope.freq_base_swa' = ", swa_base,
        ": a RoPE base for the windowed layers other than rope.freq_base (", c.rope_theta,
        ") is not supported for gemma2"));
  }
  const int64_t scale_dim =
      c.num_layers == kGemma2_27bLayers ? c.hidden_size / c.num_heads : c.head_dim;
  c.attention_scale = 1.0f / std::sqrt(static_cast<float>(scale_dim));
  RETURN_IF_ERROR(Annotate(c.Validate(), file.path()));
  return c;
}

}  // namespace

const GgufArchitecture& Gemma2Architecture() {
  static constexpr GgufArchitecture kArch{
      .name = "gemma2",
      .config_from_gguf = &Gemma2Config,
      .weights_from_gguf = &LlamaFamilyWeightsFromGguf,
  };
  return kArch;
}

}  // namespace tandem
