// Internal to engine/model: what one architecture file provides to the loader's registry, and the
// Llama-family mapping the architecture files share.
#ifndef TANDEM_ENGINE_MODEL_GGUF_ARCHITECTURE_H_
#define TANDEM_ENGINE_MODEL_GGUF_ARCHITECTURE_H_

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "engine/model/gguf.h"
#include "engine/model/model_config.h"
#include "engine/model/model_loader.h"

namespace tandem {

struct GgufArchitecture {
  absl::string_view name;  // `general.architecture` value
  absl::StatusOr<ModelConfig> (*config_from_gguf)(const GgufFile& file);
  // May point weights at tensor views it makes (e.g. row ranges of a fused matrix in the
  // mapping); it then appends what holds them to `owners` (LoadedModel::owners).
  absl::StatusOr<ModelWeights> (*weights_from_gguf)(
      const GgufFile& file, const ModelConfig& config,
      std::vector<std::shared_ptr<const void>>* owners);
};

const GgufArchitecture& LlamaArchitecture();  // arch_llama.cc
const GgufArchitecture& Qwen2Architecture();  // arch_qwen2.cc
const GgufArchitecture& Qwen3Architecture();  // arch_qwen3.cc
const GgufArchitecture& Phi3Architecture();   // arch_phi3.cc
const GgufArchitecture& GemmaArchitecture();   // arch_gemma.cc
const GgufArchitecture& Gemma2Architecture();  // arch_gemma2.cc
const GgufArchitecture& Gemma3Architecture();  // arch_gemma3.cc

// Shared by the Llama-family architectures (llama_family.cc).
struct LlamaFamilyTraits {
  absl::string_view arch;        // metadata key prefix, e.g. "llama"
  float default_rms_norm_eps;    // when `{arch}.attention.layer_norm_rms_epsilon` is absent
  float default_rope_theta;      // when `{arch}.rope.freq_base` is absent
  bool attention_bias;           // Q/K/V bias tensors are required
  bool qk_norm;                  // per-head Q/K norm tensors (attn_{q,k}_norm) are required
  bool rope_neox;                // ModelConfig::rope_neox for this architecture's files
  // > 0: the layers are windowed in a pattern of this period, the last layer of each period
  // attending fully (2: Gemma 2's alternation, from layer 0 windowed; 6: Gemma 3's five of six),
  // unless `{arch}.attention.sliding_window_pattern` gives the period or a per-layer bool array;
  // 0: every layer alike, and that key is refused.
  int64_t sliding_window_period = 0;
  // The window when `{arch}.attention.sliding_window` is absent (Gemma 2: 4096); 0: none.
  int64_t default_sliding_window = 0;
  // Post-attention and post-FFN RMSNorm tensors (post_attention_norm, post_ffw_norm) are required
  // (ModelConfig::post_norms).
  bool post_norms = false;
};
absl::StatusOr<ModelConfig> LlamaFamilyConfigFromGguf(const GgufFile& file,
                                                      const LlamaFamilyTraits& traits);
// Makes no views: `owners` is left alone.
absl::StatusOr<ModelWeights> LlamaFamilyWeightsFromGguf(
    const GgufFile& file, const ModelConfig& config,
    std::vector<std::shared_ptr<const void>>* owners);

// What every Gemma generation changes in the Llama layer (arch_gemma.cc): embeddings scaled by
// sqrt(hidden_size), a GELU-gated FFN, and the output tied to token_embd (llama.cpp multiplies by
// token_embd even when a file has an output.weight).
void ApplyGemmaCommon(ModelConfig* config);

// Sets w->token_embd, w->output_norm and w->output (token_embd when the config ties them), each
// checked by RequireGgufTensor.
absl::Status GgufTopLevelWeights(const GgufFile& file, const ModelConfig& config, ModelWeights* w);

// The tensor `name` of `file`, or NOT_FOUND naming it and `shape` (ggml order), or
// INVALID_ARGUMENT naming it, `shape` and its actual shape.
absl::StatusOr<const GgufTensor*> RequireGgufTensor(const GgufFile& file,
                                                    const ModelConfig& config,
                                                    const std::string& name,
                                                    const std::vector<int64_t>& shape);

}  // namespace tandem

#endif  // TANDEM_ENGINE_MODEL_GGUF_ARCHITECTURE_H_
