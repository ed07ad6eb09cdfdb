// GGUF architecture "phi3": Phi-3 mini/medium (4k and 128k) and Phi-3.5-mini. The Llama layout
// with NeoX RoPE pairs, no biases, and two fused matrices, as llama.cpp's converter writes them:
//   blk.N.attn_qkv.weight {H, Dq + 2 Dkv}: the rows of Q, then K, then V (llama.cpp also takes
//                                          separate attn_q/attn_k/attn_v, and so do we);
//   blk.N.ffn_up.weight   {H, 2 F}:        the rows of the gate (through SiLU), then of up.
// A row of a matrix is whole quantization blocks, so each part is a zero-copy view of a row range
// of the mapped file, and the backend sees the separate Q/K/V and gate/up it already runs.
//
// `phi3.attention.sliding_window` (Phi-3-mini-4k's 2047) is read and ignored, as llama.cpp does
// ("Phi SWA is currently disabled"): every layer attends causally over the whole context.
// LongRoPE (the 128k models and Phi-3.5): `rope_factors_long.weight` and
// `rope_factors_short.weight` ({head_dim / 2} divisors of the pairs' frequencies), with
// `phi3.rope.scaling.attn_factor` (on cos/sin; default 1) and
// `phi3.rope.scaling.original_context_length` (default: the context length). Both lists or
// neither. Which list applies is ModelConfig::UsesLongRopeFactors(). Partial RoPE (Phi-4-mini)
// is refused by name.
#include <deque>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "engine/model/gguf_architecture.h"

namespace tandem {
namespace {

constexpr LlamaFamilyTraits kPhi3Traits{
    .arch = "phi3",
    .default_rms_norm_eps = 1e-5f,
    .default_rope_theta = 10000.0f,
    .attention_bias = false,
    .qk_norm = false,
    .rope_neox = true,
};

// A LongRoPE factor list: a 1-D float tensor of `expected` entries.
absl::StatusOr<std::vector<float>> RopeFactors(const GgufFile& file, const GgufTensor& t,
                                               int64_t expected) {
  if (t.shape.size() != 1 || t.shape[0] != expected ||
      (t.type != DType::kF32 && t.type != DType::kF16 && t.type != DType::kBF16)) {
    return absl::InvalidArgumentError(absl::StrCat(
        file.path(), ": tensor '", t.name, "' (", DTypeName(t.type), ", ", t.elements(),
        " elements) must be F32/F16/BF16 with head_dim / 2 = ", expected, " elements"));
  }
  std::vector<float> out(static_cast<size_t>(expected));
  DequantizeReference(t.type, t.data, out.data(), expected);
  return out;
}

absl::StatusOr<ModelConfig> Phi3Config(const GgufFile& file) {
  ASSIGN_OR_RETURN(ModelConfig c, LlamaFamilyConfigFromGguf(file, kPhi3Traits));
  c.sliding_window = 0;  // llama.cpp ignores phi3's window; see the file comment
  const GgufTensor* long_factors = file.FindTensor("rope_factors_long.weight");
  const GgufTensor* short_factors = file.FindTensor("rope_factors_short.weight");
  if ((long_factors == nullptr) != (short_factors == nullptr)) {
    return absl::InvalidArgumentError(absl::StrCat(
        file.path(), ": tensor '",
        long_factors == nullptr ? "rope_factors_long.weight" : "rope_factors_short.weight",
        "' missing: LongRoPE needs both rope_factors_long.weight and rope_factors_short.weight"));
  }
  if (long_factors == nullptr) return c;
  if (c.head_dim <= 0 || c.head_dim % 2 != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(file.path(), ": LongRoPE needs an even head_dim, got ", c.head_dim));
  }
  c.rope_scaling = RopeScaling{};
  c.rope_scaling.type = RopeScaling::Type::kLongRope;
  ASSIGN_OR_RETURN(c.rope_scaling.long_factors,
                   RopeFactors(file, *long_factors, c.head_dim / 2));
  ASSIGN_OR_RETURN(c.rope_scaling.short_factors,
                   RopeFactors(file, *short_factors, c.head_dim / 2));
  const std::string attn_key = "phi3.rope.scaling.attn_factor";
  if (file.Has(attn_key)) {
    ASSIGN_OR_RETURN(c.rope_scaling.attn_factor, file.GetFloat32(attn_key));
  }
  const std::string original_key = "phi3.rope.scaling.original_context_length";
  c.rope_scaling.original_max_position = c.max_context;
  if (file.Has(original_key)) {
    ASSIGN_OR_RETURN(const uint32_t original, file.GetUint32(original_key));
    c.rope_scaling.original_max_position = original;
  }
  if (const absl::Status valid = c.Validate(); !valid.ok()) {
    return absl::InvalidArgumentError(absl::StrCat(file.path(), ": ", valid.message()));
  }
  return c;
}

// The rows [first, first + count) of the 2-D matrix `t` ({cols, rows} in ggml order), in place.
absl::StatusOr<GgufTensor> RowRange(const GgufFile& f, const GgufTensor& t, absl::string_view part,
                                    int64_t first, int64_t count) {
  const std::optional<int64_t> row_bytes = DTypeStorageBytes(t.type, t.shape[0]);
  if (!row_bytes.has_value() || *row_bytes * t.shape[1] != t.bytes || first < 0 || count <= 0 ||
      first + count > t.shape[1]) {
    return absl::InvalidArgumentError(absl::StrCat(f.path(), ": tensor '", t.name, "' (",
                                                   DTypeName(t.type), ") cannot be split into ",
                                                   "row ranges"));
  }
  GgufTensor view;
  view.name = absl::StrCat(t.name, "[", part, "]");
  view.type = t.type;
  view.shape = {t.shape[0], count};
  view.data = static_cast<const char*>(t.data) + first * *row_bytes;
  view.bytes = count * *row_bytes;
  view.file_offset = t.file_offset + first * *row_bytes;
  return view;
}

absl::StatusOr<ModelWeights> Phi3Weights(const GgufFile& f, const ModelConfig& c,
                                         std::vector<std::shared_ptr<const void>>* owners) {
  auto require = [&](const std::string& name, const std::vector<int64_t>& shape) {
    return RequireGgufTensor(f, c, name, shape);
  };
  const int64_t h = c.hidden_size;
  const int64_t dq = c.num_heads * c.head_dim;
  const int64_t dkv = c.num_kv_heads * c.head_dim;
  const int64_t ffn = c.intermediate_size;
  // std::deque: the views stay where they are as more are added.
  auto views = std::make_shared<std::deque<GgufTensor>>();
  auto split = [&](const GgufTensor& t, absl::string_view part, int64_t first,
                   int64_t count) -> absl::StatusOr<const GgufTensor*> {
    ASSIGN_OR_RETURN(GgufTensor view, RowRange(f, t, part, first, count));
    return &views->emplace_back(std::move(view));
  };

  ModelWeights w;
  RETURN_IF_ERROR(GgufTopLevelWeights(f, c, &w));
  // One layer at a time, as its tensors are found: block_count is the file's word, and a
  // count past its tensors fails at the first missing one instead of allocating them all.
  for (int64_t i = 0; i < c.num_layers; ++i) {
    LayerWeights& l = w.layers.emplace_back();
    auto name = [i](absl::string_view part) { return absl::StrCat("blk.", i, ".", part); };
    for (absl::string_view b : {"attn_qkv.bias", "attn_q.bias", "attn_k.bias", "attn_v.bias",
                                "attn_output.bias"}) {
      if (f.FindTensor(name(b)) != nullptr) {
        return absl::InvalidArgumentError(absl::StrCat(
            f.path(), ": tensor '", name(b), "' present, but architecture phi3 has no biases"));
      }
    }
    ASSIGN_OR_RETURN(l.attn_norm, require(name("attn_norm.weight"), {h}));
    if (f.FindTensor(name("attn_qkv.weight")) != nullptr) {
      ASSIGN_OR_RETURN(const GgufTensor* qkv, require(name("attn_qkv.weight"), {h, dq + 2 * dkv}));
      ASSIGN_OR_RETURN(l.attn_q, split(*qkv, "q", 0, dq));
      ASSIGN_OR_RETURN(l.attn_k, split(*qkv, "k", dq, dkv));
      ASSIGN_OR_RETURN(l.attn_v, split(*qkv, "v", dq + dkv, dkv));
    } else {
      ASSIGN_OR_RETURN(l.attn_q, require(name("attn_q.weight"), {h, dq}));
      ASSIGN_OR_RETURN(l.attn_k, require(name("attn_k.weight"), {h, dkv}));
      ASSIGN_OR_RETURN(l.attn_v, require(name("attn_v.weight"), {h, dkv}));
    }
    ASSIGN_OR_RETURN(l.attn_output, require(name("attn_output.weight"), {dq, h}));
    ASSIGN_OR_RETURN(l.ffn_norm, require(name("ffn_norm.weight"), {h}));
    ASSIGN_OR_RETURN(const GgufTensor* gate_up, require(name("ffn_up.weight"), {h, 2 * ffn}));
    ASSIGN_OR_RETURN(l.ffn_gate, split(*gate_up, "gate", 0, ffn));
    ASSIGN_OR_RETURN(l.ffn_up, split(*gate_up, "up", ffn, ffn));
    ASSIGN_OR_RETURN(l.ffn_down, require(name("ffn_down.weight"), {ffn, h}));
  }
  owners->push_back(std::move(views));
  return w;
}

}  // namespace

const GgufArchitecture& Phi3Architecture() {
  static constexpr GgufArchitecture kArch{
      .name = "phi3",
      .config_from_gguf = &Phi3Config,
      .weights_from_gguf = &Phi3Weights,
  };
  return kArch;
}

}  // namespace tandem
