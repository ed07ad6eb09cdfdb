#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "engine/model/model_loader.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"

namespace tandem {
namespace {

using ::testing::HasSubstr;

// A tiny Llama: hidden 8, 2 heads of 4 (1 KV head), ffn 16, vocab 10, 1 layer.
constexpr int64_t kH = 8, kDq = 8, kDkv = 4, kF = 16, kV = 10;

// name -> PyTorch shape of every tensor of that model (tied: no lm_head).
std::map<std::string, std::vector<int64_t>> TinyLlamaShapes() {
  const std::string p = "model.layers.0.";
  return {{"model.embed_tokens.weight", {kV, kH}},
          {"model.norm.weight", {kH}},
          {p + "input_layernorm.weight", {kH}},
          {p + "self_attn.q_proj.weight", {kDq, kH}},
          {p + "self_attn.k_proj.weight", {kDkv, kH}},
          {p + "self_attn.v_proj.weight", {kDkv, kH}},
          {p + "self_attn.o_proj.weight", {kH, kDq}},
          {p + "post_attention_layernorm.weight", {kH}},
          {p + "mlp.gate_proj.weight", {kF, kH}},
          {p + "mlp.up_proj.weight", {kF, kH}},
          {p + "mlp.down_proj.weight", {kH, kF}}};
}

// Writes a safetensors file of F32 tensors whose element i is `i`; the header is padded to
// `header_align` bytes (1: none, so the data may be unaligned).
void WriteSafetensors(const std::string& path,
                      const std::map<std::string, std::vector<int64_t>>& shapes,
                      int header_align) {
  nlohmann::json header = nlohmann::json::object();
  std::string data;
  for (const auto& [name, shape] : shapes) {
    int64_t n = 1;
    for (int64_t d : shape) n *= d;
    const size_t begin = data.size();
    for (int64_t i = 0; i < n; ++i) {
      const float v = static_cast<float>(i);
      data.append(reinterpret_cast<const char*>(&v), sizeof(v));
    }
    header[name] = {{"dtype", "F32"}, {"shape", shape}, {"data_offsets", {begin, data.size()}}};
  }
  std::string text = header.dump();
  while ((8 + text.size()) % static_cast<size_t>(header_align) != 0) text += ' ';
  const uint64_t length = text.size();
  std::ofstream out(path, std::ios::binary);
  out.write(reinterpret_cast<const char*>(&length), sizeof(length));
  out << text << data;
}

std::string MakeDir(const std::string& name, bool tied = true,
                    const std::string& architecture = "LlamaForCausalLM") {
  const std::string dir = absl::StrCat(::testing::TempDir(), "/hf_model_loader_test_", name);
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  const nlohmann::json config = {
      {"architectures", {architecture}}, {"vocab_size", kV}, {"hidden_size", kH},
      {"intermediate_size", kF}, {"num_hidden_layers", 1}, {"num_attention_heads", 2},
      {"num_key_value_heads", 1}, {"max_position_embeddings", 64},
      {"tie_word_embeddings", tied}};
  std::ofstream(dir + "/config.json") << config.dump();
  return dir;
}

TEST(HfModelLoaderTest, LoadsShardsAsGgmlOrderViews) {
  const std::string dir = MakeDir("shards");
  std::map<std::string, std::vector<int64_t>> first, second;
  for (const auto& [name, shape] : TinyLlamaShapes()) {
    (name.find("mlp") != std::string::npos ? second : first)[name] = shape;
  }
  WriteSafetensors(dir + "/model-00001-of-00002.safetensors", first, 8);
  WriteSafetensors(dir + "/model-00002-of-00002.safetensors", second, 1);  // unaligned data

  for (const auto& load : {&LoadHfModel, &LoadModel}) {
    absl::StatusOr<LoadedModel> m = load(dir);
    ASSERT_TRUE(m.ok()) << m.status();
    EXPECT_EQ(m->file, nullptr);
    EXPECT_TRUE(m->config.rope_neox);
    EXPECT_TRUE(m->config.tie_word_embeddings);
    EXPECT_EQ(m->weights.output, m->weights.token_embd);
    const LayerWeights& l = m->weights.layers.at(0);
    EXPECT_EQ(l.attn_k->name, "model.layers.0.self_attn.k_proj.weight");
    EXPECT_EQ(l.attn_k->shape, (std::vector<int64_t>{kH, kDkv}));
    EXPECT_EQ(l.ffn_down->shape, (std::vector<int64_t>{kF, kH}));
    EXPECT_EQ(l.attn_q_bias, nullptr);
    for (const GgufTensor* t : {l.attn_k, l.ffn_down}) {
      EXPECT_EQ(t->type, DType::kF32);
      EXPECT_EQ(reinterpret_cast<uintptr_t>(t->data) % alignof(float), 0u) << t->name;
      float v;
      std::memcpy(&v, static_cast<const char*>(t->data) + 5 * sizeof(float), sizeof(v));
      EXPECT_EQ(v, 5.0f) << t->name;
    }
  }
}

// Phi-3's fused matrices, in a shard whose data is unaligned (so they are copied first): Q, K and V
// are row ranges of qkv_proj, gate and up of gate_up_proj.
TEST(HfModelLoaderTest, SplitsPhi3FusedMatricesIntoRowViews) {
  const std::string dir = MakeDir("phi3", /*tied=*/true, "Phi3ForCausalLM");
  const std::string p = "model.layers.0.";
  auto shapes = TinyLlamaShapes();
  for (const char* part : {"self_attn.q_proj.weight", "self_attn.k_proj.weight",
                           "self_attn.v_proj.weight", "mlp.gate_proj.weight",
                           "mlp.up_proj.weight"}) {
    shapes.erase(p + part);
  }
  shapes[p + "self_attn.qkv_proj.weight"] = {kDq + 2 * kDkv, kH};
  shapes[p + "mlp.gate_up_proj.weight"] = {2 * kF, kH};
  WriteSafetensors(dir + "/model.safetensors", shapes, 1);
  absl::StatusOr<LoadedModel> m = LoadHfModel(dir);
  ASSERT_TRUE(m.ok()) << m.status();
  EXPECT_EQ(m->config.architecture, "phi3");
  const LayerWeights& l = m->weights.layers.at(0);
  struct Part {
    const GgufTensor* t;
    int64_t rows, first_row;
  };
  for (const Part& part : {Part{l.attn_q, kDq, 0}, Part{l.attn_k, kDkv, kDq},
                           Part{l.attn_v, kDkv, kDq + kDkv}, Part{l.ffn_gate, kF, 0},
                           Part{l.ffn_up, kF, kF}}) {
    EXPECT_EQ(part.t->shape, (std::vector<int64_t>{kH, part.rows})) << part.t->name;
    EXPECT_EQ(part.t->bytes, part.rows * kH * 4) << part.t->name;
    EXPECT_EQ(reinterpret_cast<uintptr_t>(part.t->data) % alignof(float), 0u) << part.t->name;
    float first;
    std::memcpy(&first, part.t->data, sizeof(first));
    EXPECT_EQ(first, static_cast<float>(part.first_row * kH)) << part.t->name;
  }

  shapes[p + "mlp.gate_up_proj.weight"] = {kF, kH};  // gate only
  WriteSafetensors(dir + "/model.safetensors", shapes, 8);
  const absl::Status s = LoadHfModel(dir).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  EXPECT_THAT(s.message(), HasSubstr("'model.layers.0.mlp.gate_up_proj.weight': expected shape "
                                     "[32, 8], got [16, 8]"));
}

TEST(HfModelLoaderTest, Qwen3NeedsItsQKNorms) {
  const std::string dir = MakeDir("qwen3", /*tied=*/true, "Qwen3ForCausalLM");
  auto shapes = TinyLlamaShapes();
  shapes["model.layers.0.self_attn.q_norm.weight"] = {kDq / 2};
  WriteSafetensors(dir + "/model.safetensors", shapes, 8);
  absl::Status s = LoadHfModel(dir).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kNotFound) << s;
  EXPECT_THAT(s.message(), HasSubstr("'model.layers.0.self_attn.k_norm.weight'"));

  shapes["model.layers.0.self_attn.k_norm.weight"] = {kDq / 2};
  WriteSafetensors(dir + "/model.safetensors", shapes, 8);
  absl::StatusOr<LoadedModel> m = LoadHfModel(dir);
  ASSERT_TRUE(m.ok()) << m.status();
  EXPECT_TRUE(m->config.qk_norm);
  EXPECT_EQ(m->weights.layers.at(0).attn_k_norm->shape, (std::vector<int64_t>{kDq / 2}));
}

// A tiny Gemma 2 or 3 folder: Gemma's head_dim stated (its default is 256), the sandwich norms.
std::map<std::string, std::vector<int64_t>> TinyGemmaShapes(const std::string& dir,
                                                            const std::string& architecture) {
  nlohmann::json config = nlohmann::json::parse(std::ifstream(dir + "/config.json"));
  config["architectures"] = {architecture};
  config["head_dim"] = kDq / 2;
  std::ofstream(dir + "/config.json") << config.dump();
  auto shapes = TinyLlamaShapes();
  const std::string p = "model.layers.0.";
  shapes[p + "pre_feedforward_layernorm.weight"] = {kH};
  shapes[p + "post_feedforward_layernorm.weight"] = {kH};
  if (architecture == "Gemma3ForCausalLM") {
    shapes[p + "self_attn.q_norm.weight"] = {kDq / 2};
    shapes[p + "self_attn.k_norm.weight"] = {kDq / 2};
  }
  return shapes;
}

// Element i of what a norm view holds, as float.
float At(const GgufTensor* t, int64_t i) {
  EXPECT_EQ(t->type, DType::kF32);
  float v = 0.0f;
  std::memcpy(&v, static_cast<const char*>(t->data) + 4 * i, sizeof(v));
  return v;
}

TEST(HfModelLoaderTest, GemmaNormsAreOnePlusTheirWeights) {
  const std::string dir = MakeDir("gemma3");
  auto shapes = TinyGemmaShapes(dir, "Gemma3ForCausalLM");
  WriteSafetensors(dir + "/model.safetensors", shapes, 1);  // unaligned data
  absl::StatusOr<LoadedModel> m = LoadHfModel(dir);
  ASSERT_TRUE(m.ok()) << m.status();
  EXPECT_EQ(m->config.architecture, "gemma3");
  const LayerWeights& l = m->weights.layers.at(0);
  const std::string p = "model.layers.0.";
  // Gemma 2/3's post_attention_layernorm is the attention output's norm, not the FFN's.
  const std::pair<const GgufTensor*, std::string> norms[] = {
      {m->weights.output_norm, "model.norm.weight"},
      {l.attn_norm, p + "input_layernorm.weight"},
      {l.attn_post_norm, p + "post_attention_layernorm.weight"},
      {l.ffn_norm, p + "pre_feedforward_layernorm.weight"},
      {l.ffn_post_norm, p + "post_feedforward_layernorm.weight"},
      {l.attn_q_norm, p + "self_attn.q_norm.weight"},
      {l.attn_k_norm, p + "self_attn.k_norm.weight"}};
  for (const auto& [t, name] : norms) {
    SCOPED_TRACE(name);
    ASSERT_NE(t, nullptr);
    EXPECT_THAT(t->name, HasSubstr(name));
    const int64_t n = static_cast<int64_t>(shapes.at(name)[0]);
    EXPECT_EQ(t->shape, (std::vector<int64_t>{n}));
    EXPECT_EQ(t->bytes, 4 * n);
    for (int64_t i = 0; i < n; ++i) EXPECT_EQ(At(t, i), 1.0f + static_cast<float>(i));
  }
  // The matrices stay views of the file; the output is the embedding (tied by default).
  EXPECT_EQ(m->weights.output, m->weights.token_embd);
  EXPECT_EQ(l.attn_q->name, p + "self_attn.q_proj.weight");
}

TEST(HfModelLoaderTest, GemmaFoldersNeedTheirNorms) {
  const std::string dir = MakeDir("gemma2");
  auto shapes = TinyGemmaShapes(dir, "Gemma2ForCausalLM");
  shapes.erase("model.layers.0.post_feedforward_layernorm.weight");
  WriteSafetensors(dir + "/model.safetensors", shapes, 8);
  absl::Status s = LoadHfModel(dir).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kNotFound) << s;
  EXPECT_THAT(s.message(), HasSubstr("'model.layers.0.post_feedforward_layernorm.weight'"));

  // Gemma 1 has the Llama layout: post_attention_layernorm is the FFN's norm.
  const std::string dir1 = MakeDir("gemma1", /*tied=*/true, "GemmaForCausalLM");
  nlohmann::json config = nlohmann::json::parse(std::ifstream(dir1 + "/config.json"));
  config["head_dim"] = kDq / 2;
  std::ofstream(dir1 + "/config.json") << config.dump();
  WriteSafetensors(dir1 + "/model.safetensors", TinyLlamaShapes(), 8);
  absl::StatusOr<LoadedModel> m = LoadHfModel(dir1);
  ASSERT_TRUE(m.ok()) << m.status();
  const LayerWeights& l = m->weights.layers.at(0);
  EXPECT_THAT(l.ffn_norm->name, HasSubstr("post_attention_layernorm"));
  EXPECT_EQ(At(l.ffn_norm, 3), 4.0f);
  EXPECT_EQ(l.attn_post_norm, nullptr);
}

TEST(HfModelLoaderTest, ErrorsNameTheTensor) {
  {
    const std::string dir = MakeDir("untied", /*tied=*/false);  // and no lm_head.weight
    WriteSafetensors(dir + "/model.safetensors", TinyLlamaShapes(), 8);
    const absl::Status s = LoadHfModel(dir).status();
    EXPECT_EQ(s.code(), absl::StatusCode::kNotFound) << s;
    EXPECT_THAT(s.message(), HasSubstr("'lm_head.weight'"));
    EXPECT_THAT(s.message(), HasSubstr("[10, 8]"));
  }
  {
    const std::string dir = MakeDir("shape");
    auto shapes = TinyLlamaShapes();
    shapes["model.layers.0.self_attn.k_proj.weight"] = {kH, kDkv};  // transposed
    WriteSafetensors(dir + "/model.safetensors", shapes, 8);
    const absl::Status s = LoadHfModel(dir).status();
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
    EXPECT_THAT(s.message(), HasSubstr("expected shape [4, 8], got [8, 4]"));
  }
  {
    const std::string dir = MakeDir("bias");
    auto shapes = TinyLlamaShapes();
    shapes["model.layers.0.self_attn.q_proj.bias"] = {kDq};
    WriteSafetensors(dir + "/model.safetensors", shapes, 8);
    const absl::Status s = LoadHfModel(dir).status();
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
    EXPECT_THAT(s.message(), HasSubstr("q_proj.bias"));
  }
  {
    const std::string dir = MakeDir("twice");
    WriteSafetensors(dir + "/a.safetensors", TinyLlamaShapes(), 8);
    WriteSafetensors(dir + "/b.safetensors", {{"model.norm.weight", {kH}}}, 8);
    const absl::Status s = LoadHfModel(dir).status();
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
    EXPECT_THAT(s.message(), HasSubstr("'model.norm.weight' is in both"));
  }
  {
    const absl::Status s = LoadHfModel(MakeDir("empty")).status();
    EXPECT_EQ(s.code(), absl::StatusCode::kNotFound) << s;
    EXPECT_THAT(s.message(), HasSubstr("no .safetensors files"));
  }
}

}  // namespace
}  // namespace tandem
