// Hugging Face model directories (config.json + *.safetensors) -> LoadedModel. Phi-3's fused
// self_attn.qkv_proj and mlp.gate_up_proj matrices become zero-copy views of their row ranges.
// Gemma's RMSNorm multiplies by (1 + w) where the others multiply by w: its norm vectors (a few
// thousand elements each) are copied as float32 with the 1 added, as llama.cpp's converter
// writes them; every matrix stays mapped in place.
#include <algorithm>
#include <cstdint>
#include <cstring>
#include <deque>
#include <filesystem>
#include <memory>
#include <string>
#include <system_error>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/status_macros.h"
#include "engine/core/dtype.h"
#include "engine/model/hf_config.h"
#include "engine/model/model_loader.h"
#include "engine/model/safetensors.h"

namespace tandem {
namespace {

// What a Hugging Face LoadedModel's tensor pointers point into.
struct HfModelStorage {
  std::vector<std::unique_ptr<SafetensorsFile>> files;
  std::deque<GgufTensor> tensors;              // deque: push_back keeps addresses stable
  std::vector<std::vector<uint8_t>> copies;    // data of tensors that were not aligned
  std::deque<std::vector<float>> plus_one;     // Gemma's norm vectors, 1 + w
};

std::string PyTorchShape(std::vector<int64_t> ggml_shape) {
  std::reverse(ggml_shape.begin(), ggml_shape.end());
  return absl::StrCat("[", absl::StrJoin(ggml_shape, ", "), "]");
}

// The .safetensors files of `dir`, sorted by name.
absl::StatusOr<std::vector<std::string>> SafetensorsPaths(const std::string& dir) {
  std::error_code ec;
  std::vector<std::string> paths;
  for (std::filesystem::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec)) {
    if (it->path().extension() == ".safetensors") paths.push_back(it->path().string());
  }
  if (ec) {
    return absl::NotFoundError(absl::StrCat(dir, ": cannot list the directory: ", ec.message()));
  }
  if (paths.empty()) return absl::NotFoundError(absl::StrCat(dir, ": no .safetensors files"));
  std::sort(paths.begin(), paths.end());
  return paths;
}

class HfTensorMapper {
 public:
  HfTensorMapper(std::string dir, HfModelStorage* storage) : dir_(std::move(dir)), s_(storage) {}

  absl::Status Index() {
    for (const auto& file : s_->files) {
      for (const SafetensorsTensor& t : file->tensors()) {
        auto [it, inserted] = index_.try_emplace(t.name, &t);
        if (!inserted) {
          return absl::InvalidArgumentError(absl::StrCat(
              dir_, ": tensor '", t.name, "' is in both ", FileOf(it->second), " and ",
              file->path()));
        }
      }
    }
    return absl::OkStatus();
  }

  bool Has(const std::string& name) const { return index_.contains(name); }

  // The tensor `name` as a view with the ggml-order shape `shape`.
  absl::StatusOr<const GgufTensor*> Require(const std::string& name,
                                            const std::vector<int64_t>& shape) {
    const auto it = index_.find(name);
    if (it == index_.end()) {
      return absl::NotFoundError(absl::StrCat(dir_, ": tensor '", name, "' not found (expected ",
                                              "shape ", PyTorchShape(shape), ")"));
    }
    const SafetensorsTensor& t = *it->second;
    std::vector<int64_t> ggml_shape(t.shape.rbegin(), t.shape.rend());
    if (ggml_shape != shape) {
      return absl::InvalidArgumentError(absl::StrCat(dir_, ": tensor '", name, "': expected shape ",
                                                     PyTorchShape(shape), ", got ",
                                                     PyTorchShape(ggml_shape)));
    }
    GgufTensor& view = s_->tensors.emplace_back();
    view.name = name;
    view.type = t.type;
    view.shape = std::move(ggml_shape);
    view.data = t.data;
    view.bytes = t.bytes;
    view.file_offset = t.file_offset;
    const auto element_bytes = static_cast<uintptr_t>(DTypeBlockBytes(t.type));
    if (reinterpret_cast<uintptr_t>(t.data) % element_bytes != 0) {
      // The kernels read elements in place; give them aligned ones.
      std::vector<uint8_t>& copy = s_->copies.emplace_back(static_cast<size_t>(t.bytes));
      std::memcpy(copy.data(), t.data, static_cast<size_t>(t.bytes));
      view.data = copy.data();
    }
    return &view;
  }

  // The norm vector `name` ({n}): as stored, or for Gemma (`plus_one`) a float32 copy of 1 + w.
  absl::StatusOr<const GgufTensor*> Norm(const std::string& name, int64_t n, bool plus_one) {
    ASSIGN_OR_RETURN(const GgufTensor* t, Require(name, {n}));
    if (!plus_one) return t;
    std::vector<float>& values = s_->plus_one.emplace_back(static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i) {
      float w = 0.0f;
      switch (t->type) {
        case DType::kF32:
          std::memcpy(&w, static_cast<const char*>(t->data) + 4 * i, 4);
          break;
        case DType::kF16:
        case DType::kBF16: {
          uint16_t bits = 0;
          std::memcpy(&bits, static_cast<const char*>(t->data) + 2 * i, 2);
          w = t->type == DType::kF16 ? HalfToFloat(bits) : BFloat16ToFloat(bits);
          break;
        }
        default:
          return absl::InvalidArgumentError(absl::StrCat(
              dir_, ": tensor '", name, "': expected F32, F16 or BF16 norm weights"));
      }
      values[static_cast<size_t>(i)] = 1.0f + w;
    }
    GgufTensor& view = s_->tensors.emplace_back(*t);
    view.name = absl::StrCat(name, "[1+w]");
    view.type = DType::kF32;
    view.data = values.data();
    view.bytes = 4 * n;
    view.file_offset = 0;
    return &view;
  }

  // The rows [first, first + count) of the 2-D matrix `t` (a PyTorch [rows, cols] weight), in
  // place: Phi-3's fused qkv_proj and gate_up_proj become the separate matrices the backend runs.
  absl::StatusOr<const GgufTensor*> Rows(const GgufTensor* t, absl::string_view part,
                                         int64_t first, int64_t count) {
    const int64_t row_bytes = t->shape.size() == 2 ? t->shape[0] * DTypeBlockBytes(t->type) : 0;
    if (row_bytes <= 0 || first < 0 || count <= 0 || first + count > t->shape[1] ||
        row_bytes * t->shape[1] != t->bytes) {
      return absl::InvalidArgumentError(
          absl::StrCat(dir_, ": tensor '", t->name, "' cannot be split into row ranges"));
    }
    GgufTensor& view = s_->tensors.emplace_back();
    view.name = absl::StrCat(t->name, "[", part, "]");
    view.type = t->type;
    view.shape = {t->shape[0], count};
    view.data = static_cast<const char*>(t->data) + first * row_bytes;
    view.bytes = count * row_bytes;
    view.file_offset = t->file_offset + first * row_bytes;
    return &view;
  }

 private:
  std::string FileOf(const SafetensorsTensor* t) const {
    for (const auto& file : s_->files) {
      if (file->FindTensor(t->name) == t) return file->path();
    }
    return "";
  }

  std::string dir_;
  HfModelStorage* s_;
  absl::flat_hash_map<std::string, const SafetensorsTensor*> index_;
};

absl::StatusOr<ModelWeights> MapHfWeights(const std::string& dir, const ModelConfig& c,
                                          HfTensorMapper& m) {
  const int64_t h = c.hidden_size;
  const int64_t dq = c.num_heads * c.head_dim;
  const int64_t dkv = c.num_kv_heads * c.head_dim;
  const bool gemma = absl::StartsWith(c.architecture, "gemma");
  ModelWeights w;
  ASSIGN_OR_RETURN(w.token_embd, m.Require("model.embed_tokens.weight", {h, c.vocab_size}));
  ASSIGN_OR_RETURN(w.output_norm, m.Norm("model.norm.weight", h, gemma));
  if (c.tie_word_embeddings) {
    w.output = w.token_embd;
  } else {
    ASSIGN_OR_RETURN(w.output, m.Require("lm_head.weight", {h, c.vocab_size}));
  }
  w.layers.resize(static_cast<size_t>(c.num_layers));
  for (int64_t i = 0; i < c.num_layers; ++i) {
    LayerWeights& l = w.layers[static_cast<size_t>(i)];
    auto name = [i](absl::string_view part) { return absl::StrCat("model.layers.", i, ".", part); };
    ASSIGN_OR_RETURN(l.attn_norm, m.Norm(name("input_layernorm.weight"), h, gemma));
    if (c.architecture == "phi3") {
      ASSIGN_OR_RETURN(const GgufTensor* qkv,
                       m.Require(name("self_attn.qkv_proj.weight"), {h, dq + 2 * dkv}));
      ASSIGN_OR_RETURN(l.attn_q, m.Rows(qkv, "q", 0, dq));
      ASSIGN_OR_RETURN(l.attn_k, m.Rows(qkv, "k", dq, dkv));
      ASSIGN_OR_RETURN(l.attn_v, m.Rows(qkv, "v", dq + dkv, dkv));
    } else {
      ASSIGN_OR_RETURN(l.attn_q, m.Require(name("self_attn.q_proj.weight"), {h, dq}));
      ASSIGN_OR_RETURN(l.attn_k, m.Require(name("self_attn.k_proj.weight"), {h, dkv}));
      ASSIGN_OR_RETURN(l.attn_v, m.Require(name("self_attn.v_proj.weight"), {h, dkv}));
    }
    ASSIGN_OR_RETURN(l.attn_output, m.Require(name("self_attn.o_proj.weight"), {dq, h}));
    if (m.Has(name("self_attn.o_proj.bias"))) {
      return absl::UnimplementedError(absl::StrCat(
          dir, ": tensor '", name("self_attn.o_proj.bias"), "': output projection biases are not "
          "supported"));
    }
    if (c.attention_bias) {
      ASSIGN_OR_RETURN(l.attn_q_bias, m.Require(name("self_attn.q_proj.bias"), {dq}));
      ASSIGN_OR_RETURN(l.attn_k_bias, m.Require(name("self_attn.k_proj.bias"), {dkv}));
      ASSIGN_OR_RETURN(l.attn_v_bias, m.Require(name("self_attn.v_proj.bias"), {dkv}));
    } else {
      for (absl::string_view b : {"self_attn.q_proj.bias", "self_attn.k_proj.bias",
                                  "self_attn.v_proj.bias", "self_attn.qkv_proj.bias"}) {
        if (m.Has(name(b))) {
          return absl::InvalidArgumentError(absl::StrCat(
              dir, ": tensor '", name(b), "' present, but config.json has no attention_bias"));
        }
      }
    }
    if (c.qk_norm) {
      ASSIGN_OR_RETURN(l.attn_q_norm, m.Norm(name("self_attn.q_norm.weight"), c.head_dim, gemma));
      ASSIGN_OR_RETURN(l.attn_k_norm, m.Norm(name("self_attn.k_norm.weight"), c.head_dim, gemma));
    }
    if (c.post_norms) {
      // Gemma 2/3's sandwich: post_attention_layernorm normalizes the attention output, and the
      // FFN has its own pre and post norms.
      ASSIGN_OR_RETURN(l.attn_post_norm, m.Norm(name("post_attention_layernorm.weight"), h, gemma));
      ASSIGN_OR_RETURN(l.ffn_norm, m.Norm(name("pre_feedforward_layernorm.weight"), h, gemma));
      ASSIGN_OR_RETURN(l.ffn_post_norm,
                       m.Norm(name("post_feedforward_layernorm.weight"), h, gemma));
    } else {
      ASSIGN_OR_RETURN(l.ffn_norm, m.Norm(name("post_attention_layernorm.weight"), h, gemma));
    }
    const int64_t ffn = c.intermediate_size;
    if (c.architecture == "phi3") {
      ASSIGN_OR_RETURN(const GgufTensor* gate_up,
                       m.Require(name("mlp.gate_up_proj.weight"), {h, 2 * ffn}));
      ASSIGN_OR_RETURN(l.ffn_gate, m.Rows(gate_up, "gate", 0, ffn));
      ASSIGN_OR_RETURN(l.ffn_up, m.Rows(gate_up, "up", ffn, ffn));
    } else {
      ASSIGN_OR_RETURN(l.ffn_gate, m.Require(name("mlp.gate_proj.weight"), {h, ffn}));
      ASSIGN_OR_RETURN(l.ffn_up, m.Require(name("mlp.up_proj.weight"), {h, ffn}));
    }
    ASSIGN_OR_RETURN(l.ffn_down, m.Require(name("mlp.down_proj.weight"), {ffn, h}));
  }
  return w;
}

}  // namespace

absl::StatusOr<LoadedModel> LoadHfModel(const std::string& dir) {
  LoadedModel model;
  ASSIGN_OR_RETURN(model.config, LoadHfConfig(dir + "/config.json"));
  ASSIGN_OR_RETURN(std::vector<std::string> paths, SafetensorsPaths(dir));
  auto storage = std::make_shared<HfModelStorage>();
  for (const std::string& path : paths) {
    ASSIGN_OR_RETURN(std::unique_ptr<SafetensorsFile> file, SafetensorsFile::Open(path));
    storage->files.push_back(std::move(file));
  }
  HfTensorMapper mapper(dir, storage.get());
  RETURN_IF_ERROR(mapper.Index());
  ASSIGN_OR_RETURN(model.weights, MapHfWeights(dir, model.config, mapper));
  model.owners.push_back(std::move(storage));
  return model;
}

absl::StatusOr<LoadedModel> LoadModel(const std::string& path) {
  std::error_code ec;
  if (std::filesystem::is_directory(path, ec)) return LoadHfModel(path);
  return LoadGgufModel(path);
}

}  // namespace tandem
