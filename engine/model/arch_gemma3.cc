// GGUF architecture "gemma3": the Gemma 3 language models (the 1B text-only layout; the text
// part of 4B/12B/27B). Gemma 2's layout (arch_gemma2.cc) with:
//   - per-head RMSNorm of Q and K before RoPE (attn_q_norm / attn_k_norm, {head_dim}, as Qwen3);
//   - no attention soft-capping; gemma3.final_logit_softcapping only when the file has it;
//   - five windowed layers of every six (gemma3.attention.sliding_window_pattern may give another
//     period or one bool per layer), and no window at all when gemma3.attention.sliding_window is
//     absent;
//   - the windowed layers' RoPE base is gemma3.rope.freq_base_swa (10000 when absent) and the
//     model's rope scaling (linear, factor 8 on 4B and up) applies to the full-attention layers
//     only;
//   - q·k scaled by 1 / sqrt(head_dim), or 1 / sqrt(hidden / heads) for the 27B model (62 layers),
//     as llama.cpp does.
// A file with the vision tower (tensors v.* / mm.*, which the converter writes to a separate
// mmproj file) is refused by name: only the text model runs.
#include <cmath>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "engine/model/gguf_architecture.h"

namespace tandem {
namespace {

constexpr LlamaFamilyTraits kGemma3Traits{
    .arch = "gemma3",
    .default_rms_norm_eps = 1e-6f,
    .default_rope_theta = 1000000.0f,
    .attention_bias = false,
    .qk_norm = true,
    .rope_neox = true,
    .sliding_window_period = 6,
    .default_sliding_window = 0,
    .post_norms = true,
};

constexpr int64_t kGemma3_27bLayers = 62;

absl::StatusOr<ModelConfig> Gemma3Config(const GgufFile& file) {
  for (const GgufTensor& t : file.tensors()) {
    if (absl::StartsWith(t.name, "v.") || absl::StartsWith(t.name, "mm.")) {
      return absl::UnimplementedError(absl::StrCat(
          file.path(), ": tensor '", t.name, "': Gemma 3's vision tower is not supported (only "
          "the text model runs)"));
    }
  }
  ASSIGN_OR_RETURN(ModelConfig c, LlamaFamilyConfigFromGguf(file, kGemma3Traits));
  ApplyGemmaCommon(&c);
  // Gemma 3 may keep a separate output matrix (llama.cpp uses it when present).
  c.tie_word_embeddings = file.FindTensor("output.weight") == nullptr;
  if (file.Has("gemma3.attn_logit_softcapping")) {
    return absl::UnimplementedError(absl::StrCat(
        file.path(), ": metadata key 'gemma3.attn_logit_softcapping': Gemma 3 has no attention "
        "soft-capping"));
  }
  if (file.Has("gemma3.final_logit_softcapping")) {
    ASSIGN_OR_RETURN(c.final_logit_softcap, file.GetFloat32("gemma3.final_logit_softcapping"));
  }
  if (c.sliding_window > 0) {
    c.rope_theta_sliding = 10000.0f;
    if (file.Has("gemma3.rope.freq_base_swa")) {
      ASSIGN_OR_RETURN(c.rope_theta_sliding, file.GetFloat32("gemma3.rope.freq_base_swa"));
    }
  }
  const int64_t scale_dim =
      c.num_layers == kGemma3_27bLayers ? c.hidden_size / c.num_heads : c.head_dim;
  c.attention_scale = 1.0f / std::sqrt(static_cast<float>(scale_dim));
  RETURN_IF_ERROR(Annotate(c.Validate(), file.path()));
  return c;
}

}  // namespace

const GgufArchitecture& Gemma3Architecture() {
  static constexpr GgufArchitecture kArch{
      .name = "gemma3",
      .config_from_gguf = &Gemma3Config,
      .weights_from_gguf = &LlamaFamilyWeightsFromGguf,
  };
  return kArch;
}

}  // namespace tandem
