// Loading a model into a ModelConfig and a ModelWeights map of named tensors, from a GGUF file or
// from a Hugging Face directory (config.json and *.safetensors).
//
//   ASSIGN_OR_RETURN(LoadedModel model, LoadGgufModel("models/SmolLM2-135M-Instruct.Q4_1.gguf"));
//   const GgufTensor* wq = model.weights.layers[0].attn_q;  // ggml shape {hidden, heads*head_dim}
//
// For GGUF the architecture comes from `general.architecture`; one source file per architecture
// (arch_llama.cc, arch_qwen2.cc, arch_qwen3.cc, arch_phi3.cc, arch_gemma*.cc) maps its metadata
// and tensor names;
// Phi-3's fused attn_qkv and gate/up matrices become views of their row ranges (held in `owners`).
// For Hugging Face directories it comes from config.json (hf_config.h) and hf_model_loader.cc maps
// the tensor names.
//
// Every tensor is a GgufTensor view whatever the file format: for safetensors, `shape` is the
// reversed PyTorch shape (ggml order) and `file_offset` is the offset in its .safetensors file.
//
// Shapes are in ggml order (shape[0] contiguous). With H = hidden_size, F = intermediate_size,
// V = vocab_size, Dq = num_heads * head_dim, Dkv = num_kv_heads * head_dim:
//   token_embd   {H, V}     output_norm {H}       output {H, V} (== token_embd when tied)
//   attn_norm    {H}        attn_q {H, Dq}        attn_k {H, Dkv}     attn_v {H, Dkv}
//   attn_output  {Dq, H}    attn_q_bias {Dq}      attn_k_bias {Dkv}   attn_v_bias {Dkv}
//   attn_q_norm  {head_dim} attn_k_norm {head_dim}
//   ffn_norm     {H}        ffn_gate {H, F}       ffn_up {H, F}       ffn_down {F, H}
// (A weight {in, out} in ggml order is a PyTorch [out, in] matrix: y = W x.)
#ifndef TANDEM_ENGINE_MODEL_MODEL_LOADER_H_
#define TANDEM_ENGINE_MODEL_MODEL_LOADER_H_

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "engine/model/gguf.h"
#include "engine/model/model_config.h"

namespace tandem {

// One transformer block. Pointers are into the owning LoadedModel; never null except the biases,
// which are set exactly when ModelConfig::attention_bias is true, and the Q/K norms, set exactly
// when ModelConfig::qk_norm is true.
struct LayerWeights {
  const GgufTensor* attn_norm = nullptr;
  const GgufTensor* attn_q = nullptr;
  const GgufTensor* attn_k = nullptr;
  const GgufTensor* attn_v = nullptr;
  const GgufTensor* attn_output = nullptr;
  const GgufTensor* attn_q_bias = nullptr;
  const GgufTensor* attn_k_bias = nullptr;
  const GgufTensor* attn_v_bias = nullptr;
  const GgufTensor* attn_q_norm = nullptr;  // {head_dim}, shared by every Q head
  const GgufTensor* attn_k_norm = nullptr;  // {head_dim}, shared by every K head
  const GgufTensor* ffn_norm = nullptr;
  const GgufTensor* ffn_gate = nullptr;
  const GgufTensor* ffn_up = nullptr;
  const GgufTensor* ffn_down = nullptr;
  // {H} each, set exactly when ModelConfig::post_norms (Gemma 2/3): RMSNorm of the attention
  // output and of the FFN output before their residual adds.
  const GgufTensor* attn_post_norm = nullptr;
  const GgufTensor* ffn_post_norm = nullptr;
};

struct ModelWeights {
  const GgufTensor* token_embd = nullptr;
  const GgufTensor* output_norm = nullptr;
  const GgufTensor* output = nullptr;  // == token_embd when tie_word_embeddings
  // Optional per-frequency RoPE divisors {head_dim / 2} (llama.cpp stores Llama 3.1's rope
  // scaling this way); nullptr when absent.
  const GgufTensor* rope_freqs = nullptr;
  std::vector<LayerWeights> layers;  // num_layers entries
};

// A model ready for a backend. Movable; the tensor pointers stay valid across moves because they
// point into `file` or into what `owners` holds, which must outlive every use of `weights`.
struct LoadedModel {
  // The GGUF file the model came from (its tokenizer metadata included); null for a model loaded
  // from a Hugging Face directory.
  std::unique_ptr<GgufFile> file;
  // Whatever else the tensors point into (for a Hugging Face model: the mapped .safetensors files
  // and the tensor views). Type-erased: nothing reads it; it only keeps the storage alive.
  std::vector<std::shared_ptr<const void>> owners;
  ModelConfig config;
  ModelWeights weights;
};

// Opens a GGUF file and maps it by its `general.architecture`. Errors: those of GgufFile::Open;
// NOT_FOUND / INVALID_ARGUMENT for missing or mistyped metadata (naming the key); INVALID_ARGUMENT
// for a config that fails ModelConfig::Validate(); NOT_FOUND for a missing tensor and
// INVALID_ARGUMENT for a wrong shape (naming the tensor, expected and actual shapes);
// UNIMPLEMENTED for an architecture not in SupportedGgufArchitectures() (naming it).
absl::StatusOr<LoadedModel> LoadGgufModel(const std::string& path);
// The same for an already-parsed file (takes ownership).
absl::StatusOr<LoadedModel> LoadGgufModel(std::unique_ptr<GgufFile> file);

// Loads a Hugging Face model directory: `dir`/config.json (see ModelConfigFromHfConfigJson) and
// every `dir`/*.safetensors (a single file or shards; F32, F16 or BF16 tensors), mapped read-only
// and used in place (a tensor whose data is not aligned to its element size is copied). Tensor
// names are Hugging Face's: model.embed_tokens.weight, model.norm.weight, lm_head.weight (absent or
// ignored when tie_word_embeddings), model.layers.N.{input_layernorm, post_attention_layernorm}
// .weight, model.layers.N.self_attn.{q,k,v,o}_proj.weight, model.layers.N.self_attn.{q,k,v}_proj
// .bias (when attention_bias), model.layers.N.self_attn.{q,k}_norm.weight (when qk_norm: Qwen3),
// model.layers.N.mlp.{gate,up,down}_proj.weight; for Phi-3 self_attn.qkv_proj.weight (the rows of
// Q, K, V) and mlp.gate_up_proj.weight (gate, then up) instead, split into views; others ignored.
// config.rope_neox is true. Errors: those of LoadHfConfig and SafetensorsFile::Open; NOT_FOUND for
// a directory without .safetensors files or a missing tensor; INVALID_ARGUMENT for a tensor in two
// files, a wrong shape (naming the tensor, expected and actual shapes in PyTorch order) or a bias
// the architecture does not have; UNIMPLEMENTED for an o_proj bias.
absl::StatusOr<LoadedModel> LoadHfModel(const std::string& dir);

// LoadHfModel when `path` is a directory, else LoadGgufModel.
absl::StatusOr<LoadedModel> LoadModel(const std::string& path);

// Only the config (no tensor mapping), e.g. for planning memory before loading weights.
absl::StatusOr<ModelConfig> ModelConfigFromGguf(const GgufFile& file);

// {"llama", "qwen2", "qwen3", "phi3", "gemma", "gemma2", "gemma3"}.
std::vector<std::string> SupportedGgufArchitectures();

}  // namespace tandem

#endif  // TANDEM_ENGINE_MODEL_MODEL_LOADER_H_
