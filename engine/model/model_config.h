// The shape of a Llama-family transformer (Llama 2/3, SmolLM/SmolLM2, TinyLlama, Mistral, Qwen2,
// Qwen3, Phi-3, Gemma 1/2/3), as read from a model file, and its validation.
#ifndef TANDEM_ENGINE_MODEL_MODEL_CONFIG_H_
#define TANDEM_ENGINE_MODEL_MODEL_CONFIG_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"

namespace tandem {

// How RoPE frequencies are rescaled for contexts longer than the model was trained on.
struct RopeScaling {
  enum class Type { kNone, kLinear, kLlama3, kLongRope };
  Type type = Type::kNone;
  // kLinear: positions are divided by `factor`. kLlama3: low frequencies are divided by `factor`.
  float factor = 1.0f;
  // kLlama3 only (Llama 3.1's "rope_type": "llama3").
  float low_freq_factor = 1.0f;
  float high_freq_factor = 4.0f;
  // kLlama3 and kLongRope: the context the model was pretrained for.
  int64_t original_max_position = 8192;
  // kLongRope only (Phi-3-*-128k, Phi-3.5): the divisors of each rotated pair's frequency
  // (head_dim / 2 each), and the factor cos and sin are multiplied by. Which list applies is
  // ModelConfig::UsesLongRopeFactors().
  std::vector<float> long_factors;
  std::vector<float> short_factors;
  float attn_factor = 1.0f;
};

// "none", "linear", "llama3", "longrope".
absl::string_view RopeScalingTypeName(RopeScaling::Type type);

// Hyper-parameters of a decoder-only Llama-family model. All sizes are element counts.
struct ModelConfig {
  // GGUF `general.architecture` spelling: "llama", "qwen2", "qwen3", "phi3", "gemma", "gemma2"
  // or "gemma3".
  std::string architecture;
  int64_t vocab_size = 0;         // rows of the token embedding
  int64_t hidden_size = 0;        // d_model
  int64_t intermediate_size = 0;  // SwiGLU inner size (ffn_gate / ffn_up outputs)
  int64_t num_layers = 0;
  int64_t num_heads = 0;     // query heads
  int64_t num_kv_heads = 0;  // key/value heads (grouped-query attention when < num_heads)
  int64_t head_dim = 0;      // per-head size of Q, K and V; hidden_size / num_heads by default
  int64_t max_context = 0;   // positions the model was trained for
  float rms_norm_eps = 1e-5f;
  float rope_theta = 10000.0f;  // RoPE base frequency
  RopeScaling rope_scaling;
  // The output projection reuses token_embd (no separate `output.weight`).
  bool tie_word_embeddings = false;
  // Q, K and V projections have biases (Qwen2).
  bool attention_bias = false;
  // Each head of Q and of K is RMS-normalized (weights of head_dim, eps rms_norm_eps) after the
  // projection and before RoPE (Qwen3).
  bool qk_norm = false;
  // > 0: sliding-window attention in every layer, each token attending to its last
  // `sliding_window` positions, itself included (Mistral 7B v0.1's 4096); 0: full causal attention.
  int64_t sliding_window = 0;
  // With sliding_window > 0: which layers are windowed (num_layers entries; Gemma 2 alternates,
  // Gemma 3 windows five layers of six); empty: every layer.
  std::vector<bool> sliding_layers;
  // Gemma 3: the RoPE base of the windowed layers (0: rope_theta). Those layers also leave out
  // rope_scaling, which applies to the full-attention layers only.
  float rope_theta_sliding = 0.0f;

  // What Gemma changes in the Llama layer (the defaults are Llama's).
  // The token embeddings are multiplied by this (Gemma: sqrt(hidden_size)).
  float embedding_scale = 1.0f;
  // The gated FFN's activation: SiLU (SwiGLU) or GELU with the tanh approximation (GeGLU, Gemma).
  enum class Activation { kSilu, kGeluTanh };
  Activation ffn_activation = Activation::kSilu;
  // The attention output and the FFN output are each RMS-normalized (own weights) before their
  // residual add (Gemma 2/3's post_attention_norm and post_ffw_norm).
  bool post_norms = false;
  // q·k is scaled by this before the softmax; 0: 1 / sqrt(head_dim).
  float attention_scale = 0.0f;
  // > 0: attention scores become cap * tanh(score / cap) (Gemma 2's attn_logit_softcapping).
  float attn_logit_softcap = 0.0f;
  // > 0: the logits become cap * tanh(logit / cap) (Gemma 2's final_logit_softcapping).
  float final_logit_softcap = 0.0f;

  // The sliding window of layer `l`: sliding_window when that layer is windowed, else 0.
  int64_t LayerWindow(int64_t l) const {
    if (sliding_window <= 0) return 0;
    if (sliding_layers.empty()) return sliding_window;
    return sliding_layers[static_cast<size_t>(l)] ? sliding_window : 0;
  }
  // LongRoPE's choice, fixed per model load: the long factors when the context served
  // (max_context) exceeds rope_scaling.original_max_position, for every position of every
  // sequence; else the short ones. A paged KV cache keeps keys rotated once, so the factors cannot
  // change when a sequence grows past the original context (docs/engine.md, "LongRoPE").
  bool UsesLongRopeFactors() const {
    return max_context > rope_scaling.original_max_position;
  }
  // How RoPE pairs the dimensions of a head, which depends on how the file orders the Q/K rows:
  // true for NeoX / Hugging Face "rotate_half" pairs (i, i + head_dim / 2), false for adjacent
  // pairs (2i, 2i + 1). Set by the loader: GGUF "llama" files are interleaved (llama.cpp's
  // converter permutes the Q/K rows), GGUF "qwen2" files and every Hugging Face checkpoint NeoX.
  bool rope_neox = false;

  // INVALID_ARGUMENT naming the first field that is out of range: every size positive, num_heads
  // dividing hidden_size, num_kv_heads dividing num_heads, head_dim even (RoPE rotates pairs),
  // rms_norm_eps and rope_theta positive and finite, rope scaling parameters consistent,
  // sliding_layers empty or one per layer, the Gemma scales and caps finite and non-negative.
  [[nodiscard]] absl::Status Validate() const;

  // One line, for logs: "llama layers=30 hidden=576 heads=9/3 head_dim=64 ffn=1536 vocab=49152 ...".
  std::string DebugString() const;
};

}  // namespace tandem

#endif  // TANDEM_ENGINE_MODEL_MODEL_CONFIG_H_
