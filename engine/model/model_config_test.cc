#include "engine/model/model_config.h"

#include <cmath>
#include <functional>
#include <limits>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "engine/model/gguf_test_writer.h"
#include "engine/model/model_loader.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace tandem {
namespace {

using ::tandem::testing::F32;
using ::tandem::testing::GgufTestValue;
using ::tandem::testing::GgufTestWriter;
using ::tandem::testing::Str;
using ::tandem::testing::StrArr;
using ::tandem::testing::U32;
using ::testing::HasSubstr;

constexpr char kName[] = "tiny.gguf";

// A tiny random-free Llama-family model: hidden 64, 4 heads of 16, 2 KV heads, FFN 96, vocab 40.
struct TinyModelSpec {
  std::string arch = "llama";
  int64_t layers = 2;
  int64_t hidden = 64;
  int64_t heads = 4;
  int64_t kv_heads = 2;
  int64_t ffn = 96;
  int64_t vocab = 40;
  bool tied = true;
  bool biases = false;
  bool qk_norms = false;  // blk.N.attn_{q,k}_norm.weight
  bool post_norms = false;  // blk.N.post_attention_norm.weight, blk.N.post_ffw_norm.weight
  // Phi-3's layout: blk.N.attn_qkv.weight instead of attn_{q,k,v}, and blk.N.ffn_up.weight
  // holding gate and up (2 * ffn rows) instead of ffn_gate + ffn_up.
  bool fused_qkv = false;
  bool fused_gate_up = false;
  // Metadata changes: a value replaces (or adds) the key, std::nullopt removes it.
  std::map<std::string, std::optional<GgufTestValue>> kv_override;
  std::set<std::string> skip_tensors;
  std::map<std::string, std::vector<int64_t>> shape_override;
  std::map<std::string, std::vector<int64_t>> extra_tensors;  // F32, written after the rest
  std::map<std::string, std::vector<float>> f32_tensors;       // 1-D F32 holding these values
};

std::string BuildTinyModel(const TinyModelSpec& s) {
  const std::string a = s.arch;
  std::vector<std::pair<std::string, GgufTestValue>> kvs = {
      {"general.architecture", Str(a)},
      {a + ".block_count", U32(static_cast<uint32_t>(s.layers))},
      {a + ".context_length", U32(128)},
      {a + ".embedding_length", U32(static_cast<uint32_t>(s.hidden))},
      {a + ".feed_forward_length", U32(static_cast<uint32_t>(s.ffn))},
      {a + ".attention.head_count", U32(static_cast<uint32_t>(s.heads))},
      {a + ".attention.head_count_kv", U32(static_cast<uint32_t>(s.kv_heads))},
      {a + ".attention.layer_norm_rms_epsilon", F32(1e-5f)},
      {a + ".rope.freq_base", F32(10000.0f)},
  };
  std::vector<std::string> tokens;
  for (int64_t i = 0; i < s.vocab; ++i) tokens.push_back(absl::StrCat("tok", i));
  kvs.emplace_back("tokenizer.ggml.tokens", StrArr(tokens));
  GgufTestWriter w;
  for (auto& [key, value] : kvs) {
    auto it = s.kv_override.find(key);
    if (it == s.kv_override.end()) {
      w.Add(key, value);
    } else if (it->second) {
      w.Add(key, *it->second);
    }
  }
  for (const auto& [key, value] : s.kv_override) {
    bool existing = false;
    for (const auto& kv : kvs) existing |= kv.first == key;
    if (!existing && value) w.Add(key, *value);
  }
  const int64_t hd = s.hidden / s.heads;
  auto add = [&](const std::string& name, DType type, std::vector<int64_t> shape) {
    if (s.skip_tensors.contains(name)) return;
    if (auto it = s.shape_override.find(name); it != s.shape_override.end()) shape = it->second;
    w.AddZeroTensor(name, type, shape);
  };
  add("token_embd.weight", DType::kQ8_0, {s.hidden, s.vocab});
  add("output_norm.weight", DType::kF32, {s.hidden});
  if (!s.tied) add("output.weight", DType::kQ4_1, {s.hidden, s.vocab});
  for (int64_t i = 0; i < s.layers; ++i) {
    const std::string p = absl::StrCat("blk.", i, ".");
    add(p + "attn_norm.weight", DType::kF32, {s.hidden});
    if (s.fused_qkv) {
      add(p + "attn_qkv.weight", DType::kQ4_1, {s.hidden, (s.heads + 2 * s.kv_heads) * hd});
    } else {
      add(p + "attn_q.weight", DType::kQ4_1, {s.hidden, s.heads * hd});
      add(p + "attn_k.weight", DType::kQ4_0, {s.hidden, s.kv_heads * hd});
      add(p + "attn_v.weight", DType::kF16, {s.hidden, s.kv_heads * hd});
    }
    add(p + "attn_output.weight", DType::kBF16, {s.heads * hd, s.hidden});
    if (s.biases) {
      add(p + "attn_q.bias", DType::kF32, {s.heads * hd});
      add(p + "attn_k.bias", DType::kF32, {s.kv_heads * hd});
      add(p + "attn_v.bias", DType::kF32, {s.kv_heads * hd});
    }
    if (s.qk_norms) {
      add(p + "attn_q_norm.weight", DType::kF32, {hd});
      add(p + "attn_k_norm.weight", DType::kF32, {hd});
    }
    if (s.post_norms) {
      add(p + "post_attention_norm.weight", DType::kF32, {s.hidden});
      add(p + "post_ffw_norm.weight", DType::kF32, {s.hidden});
    }
    add(p + "ffn_norm.weight", DType::kF32, {s.hidden});
    if (s.fused_gate_up) {
      add(p + "ffn_up.weight", DType::kQ8_0, {s.hidden, 2 * s.ffn});
    } else {
      add(p + "ffn_gate.weight", DType::kQ8_0, {s.hidden, s.ffn});
      add(p + "ffn_up.weight", DType::kQ8_0, {s.hidden, s.ffn});
    }
    add(p + "ffn_down.weight", DType::kQ8_0, {s.ffn, s.hidden});
  }
  for (const auto& [name, shape] : s.extra_tensors) add(name, DType::kF32, shape);
  for (const auto& [name, values] : s.f32_tensors) {
    w.AddTensor(name, DType::kF32, {static_cast<int64_t>(values.size())},
                std::string(reinterpret_cast<const char*>(values.data()),
                            values.size() * sizeof(float)));
  }
  return w.Build();
}

absl::StatusOr<LoadedModel> LoadTiny(const TinyModelSpec& spec) {
  absl::StatusOr<std::unique_ptr<GgufFile>> file = GgufFile::FromBytes(BuildTinyModel(spec), kName);
  if (!file.ok()) return file.status();
  return LoadGgufModel(std::move(file).value());
}

TEST(ModelLoaderTest, LoadsLlamaTiedAndUntied) {
  for (bool tied : {true, false}) {
    SCOPED_TRACE(tied ? "tied" : "untied");
    TinyModelSpec spec;
    spec.tied = tied;
    absl::StatusOr<LoadedModel> m = LoadTiny(spec);
    ASSERT_TRUE(m.ok()) << m.status();
    const ModelConfig& c = m->config;
    EXPECT_EQ(c.architecture, "llama");
    EXPECT_EQ(c.num_layers, 2);
    EXPECT_EQ(c.hidden_size, 64);
    EXPECT_EQ(c.intermediate_size, 96);
    EXPECT_EQ(c.num_heads, 4);
    EXPECT_EQ(c.num_kv_heads, 2);
    EXPECT_EQ(c.head_dim, 16);
    EXPECT_EQ(c.vocab_size, 40);
    EXPECT_EQ(c.max_context, 128);
    EXPECT_FLOAT_EQ(c.rms_norm_eps, 1e-5f);
    EXPECT_FLOAT_EQ(c.rope_theta, 10000.0f);
    EXPECT_EQ(c.rope_scaling.type, RopeScaling::Type::kNone);
    EXPECT_FALSE(c.attention_bias);
    EXPECT_EQ(c.tie_word_embeddings, tied);
    const ModelWeights& w = m->weights;
    EXPECT_EQ(w.token_embd->name, "token_embd.weight");
    EXPECT_EQ(w.token_embd->type, DType::kQ8_0);
    EXPECT_EQ(w.output->name, tied ? "token_embd.weight" : "output.weight");
    EXPECT_EQ(w.output == w.token_embd, tied);
    EXPECT_EQ(w.rope_freqs, nullptr);
    ASSERT_EQ(w.layers.size(), 2u);
    for (size_t i = 0; i < w.layers.size(); ++i) {
      const LayerWeights& l = w.layers[i];
      EXPECT_EQ(l.attn_k->name, absl::StrCat("blk.", i, ".attn_k.weight"));
      EXPECT_EQ(l.ffn_down->shape, (std::vector<int64_t>{96, 64}));
      EXPECT_EQ(l.attn_output->type, DType::kBF16);
      EXPECT_EQ(l.attn_q_bias, nullptr);
      EXPECT_NE(l.attn_norm, nullptr);
      EXPECT_NE(l.ffn_norm, nullptr);
      EXPECT_NE(l.ffn_gate, nullptr);
      EXPECT_NE(l.ffn_up, nullptr);
      EXPECT_NE(l.attn_v, nullptr);
    }
    // The weights point into the file the LoadedModel owns.
    EXPECT_EQ(m->file->FindTensor("blk.1.ffn_up.weight"), w.layers[1].ffn_up);
  }
}

TEST(ModelLoaderTest, Qwen2NeedsItsQkvBiases) {
  TinyModelSpec spec;
  spec.arch = "qwen2";
  spec.kv_override["qwen2.attention.layer_norm_rms_epsilon"] = std::nullopt;  // default 1e-6
  spec.biases = true;
  absl::StatusOr<LoadedModel> m = LoadTiny(spec);
  ASSERT_TRUE(m.ok()) << m.status();
  EXPECT_EQ(m->config.architecture, "qwen2");
  EXPECT_TRUE(m->config.attention_bias);
  EXPECT_TRUE(m->config.rope_neox);
  EXPECT_FLOAT_EQ(m->config.rms_norm_eps, 1e-6f);
  for (const LayerWeights& l : m->weights.layers) {
    ASSERT_NE(l.attn_q_bias, nullptr);
    EXPECT_EQ(l.attn_q_bias->shape, (std::vector<int64_t>{64}));
    ASSERT_NE(l.attn_k_bias, nullptr);
    EXPECT_EQ(l.attn_k_bias->shape, (std::vector<int64_t>{32}));
    ASSERT_NE(l.attn_v_bias, nullptr);
  }

  spec.biases = false;
  absl::Status s = LoadTiny(spec).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kNotFound) << s;
  EXPECT_THAT(s.message(), HasSubstr("'blk.0.attn_q.bias'"));
  EXPECT_THAT(s.message(), HasSubstr("{64}"));

  // Llama has no biases: a file carrying them is refused rather than silently misread.
  TinyModelSpec llama;
  llama.biases = true;
  s = LoadTiny(llama).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  EXPECT_THAT(s.message(), HasSubstr("'blk.0.attn_q.bias'"));
}

TEST(ModelLoaderTest, Qwen3NeedsItsQkNorms) {
  TinyModelSpec spec;
  spec.arch = "qwen3";
  spec.kv_override["qwen3.attention.layer_norm_rms_epsilon"] = std::nullopt;  // default 1e-6
  spec.kv_override["qwen3.attention.key_length"] = U32(32);  // head_dim != hidden / heads
  spec.kv_override["qwen3.attention.value_length"] = U32(32);
  spec.shape_override = {{"blk.0.attn_q.weight", {64, 128}}, {"blk.1.attn_q.weight", {64, 128}},
                         {"blk.0.attn_k.weight", {64, 64}},  {"blk.1.attn_k.weight", {64, 64}},
                         {"blk.0.attn_v.weight", {64, 64}},  {"blk.1.attn_v.weight", {64, 64}},
                         {"blk.0.attn_output.weight", {128, 64}},
                         {"blk.1.attn_output.weight", {128, 64}},
                         {"blk.0.attn_q_norm.weight", {32}}, {"blk.1.attn_q_norm.weight", {32}},
                         {"blk.0.attn_k_norm.weight", {32}}, {"blk.1.attn_k_norm.weight", {32}}};
  spec.qk_norms = true;
  absl::StatusOr<LoadedModel> m = LoadTiny(spec);
  ASSERT_TRUE(m.ok()) << m.status();
  EXPECT_EQ(m->config.architecture, "qwen3");
  EXPECT_TRUE(m->config.qk_norm);
  EXPECT_FALSE(m->config.attention_bias);
  EXPECT_TRUE(m->config.rope_neox);
  EXPECT_EQ(m->config.head_dim, 32);
  EXPECT_FLOAT_EQ(m->config.rms_norm_eps, 1e-6f);
  EXPECT_FLOAT_EQ(m->config.rope_theta, 10000.0f);  // the file's, over the 1e6 default
  for (const LayerWeights& l : m->weights.layers) {
    ASSERT_NE(l.attn_q_norm, nullptr);
    EXPECT_EQ(l.attn_q_norm->shape, (std::vector<int64_t>{32}));
    ASSERT_NE(l.attn_k_norm, nullptr);
    EXPECT_EQ(l.attn_q_bias, nullptr);
  }

  // Without its norms a Qwen3 file is refused, naming the tensor and its shape.
  TinyModelSpec missing = spec;
  missing.skip_tensors.insert("blk.1.attn_k_norm.weight");
  absl::Status s = LoadTiny(missing).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kNotFound) << s;
  EXPECT_THAT(s.message(), HasSubstr("'blk.1.attn_k_norm.weight'"));
  EXPECT_THAT(s.message(), HasSubstr("{32}"));

  // A Llama file with Q/K norms would be misread without them: refused, naming the tensor.
  TinyModelSpec llama;
  llama.qk_norms = true;
  s = LoadTiny(llama).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kUnimplemented) << s;
  EXPECT_THAT(s.message(), HasSubstr("'blk.0.attn_q_norm.weight'"));
  EXPECT_THAT(s.message(), HasSubstr("llama"));
}

TEST(ModelLoaderTest, Phi3SplitsItsFusedMatricesInPlace) {
  TinyModelSpec spec;
  spec.arch = "phi3";
  spec.fused_qkv = true;
  spec.fused_gate_up = true;
  spec.kv_override["phi3.attention.sliding_window"] = U32(16);
  absl::StatusOr<LoadedModel> m = LoadTiny(spec);
  ASSERT_TRUE(m.ok()) << m.status();
  EXPECT_EQ(m->config.architecture, "phi3");
  EXPECT_TRUE(m->config.rope_neox);
  EXPECT_FALSE(m->config.attention_bias);
  EXPECT_EQ(m->config.sliding_window, 0);  // as llama.cpp: phi3's window is not applied
  EXPECT_EQ(m->config.intermediate_size, 96);
  for (int i = 0; i < 2; ++i) {
    SCOPED_TRACE(i);
    const LayerWeights& l = m->weights.layers[static_cast<size_t>(i)];
    const GgufTensor* qkv = m->file->FindTensor(absl::StrCat("blk.", i, ".attn_qkv.weight"));
    ASSERT_NE(qkv, nullptr);
    const char* base = static_cast<const char*>(qkv->data);
    const int64_t row = 64 / 32 * 20;  // Q4_1: 20 bytes per 32 values
    EXPECT_EQ(l.attn_q->shape, (std::vector<int64_t>{64, 64}));
    EXPECT_EQ(l.attn_k->shape, (std::vector<int64_t>{64, 32}));
    EXPECT_EQ(l.attn_v->shape, (std::vector<int64_t>{64, 32}));
    EXPECT_EQ(l.attn_q->type, DType::kQ4_1);
    EXPECT_EQ(l.attn_q->data, base);
    EXPECT_EQ(l.attn_k->data, base + 64 * row);
    EXPECT_EQ(l.attn_v->data, base + 96 * row);
    EXPECT_EQ(l.attn_v->bytes, 32 * row);
    EXPECT_EQ(l.attn_v->file_offset, qkv->file_offset + 96 * row);
    const GgufTensor* up = m->file->FindTensor(absl::StrCat("blk.", i, ".ffn_up.weight"));
    ASSERT_NE(up, nullptr);
    const int64_t up_row = 64 / 32 * 34;  // Q8_0
    EXPECT_EQ(l.ffn_gate->data, up->data);
    EXPECT_EQ(l.ffn_up->data, static_cast<const char*>(up->data) + 96 * up_row);
    EXPECT_EQ(l.ffn_gate->shape, (std::vector<int64_t>{64, 96}));
    EXPECT_EQ(l.ffn_up->shape, (std::vector<int64_t>{64, 96}));
    EXPECT_EQ(l.ffn_up->name, absl::StrCat("blk.", i, ".ffn_up.weight[up]"));
  }

  // llama.cpp also takes separate Q/K/V in a phi3 file; gate/up stay fused.
  TinyModelSpec separate = spec;
  separate.fused_qkv = false;
  m = LoadTiny(separate);
  ASSERT_TRUE(m.ok()) << m.status();
  EXPECT_EQ(m->weights.layers[1].attn_k, m->file->FindTensor("blk.1.attn_k.weight"));

  // An ffn_up of F rows (the Llama layout) is refused naming the 2F it must have.
  TinyModelSpec unfused = spec;
  unfused.fused_gate_up = false;
  absl::Status s = LoadTiny(unfused).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  EXPECT_THAT(s.message(), HasSubstr("'blk.0.ffn_up.weight': expected shape {64, 192}"));

  TinyModelSpec wrong_qkv = spec;
  wrong_qkv.shape_override["blk.1.attn_qkv.weight"] = {64, 64};
  s = LoadTiny(wrong_qkv).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  EXPECT_THAT(s.message(), HasSubstr("'blk.1.attn_qkv.weight': expected shape {64, 128}"));

  TinyModelSpec no_qkv = spec;
  no_qkv.skip_tensors.insert("blk.0.attn_qkv.weight");
  s = LoadTiny(no_qkv).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kNotFound) << s;
  EXPECT_THAT(s.message(), HasSubstr("'blk.0.attn_q.weight'"));

  // Partial RoPE (Phi-4-mini) is refused by its key.
  TinyModelSpec partial = spec;
  partial.kv_override["phi3.rope.dimension_count"] = U32(12);
  s = LoadTiny(partial).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kUnimplemented) << s;
  EXPECT_THAT(s.message(), HasSubstr("phi3.rope.dimension_count"));
}

// Phi-3 LongRoPE: both factor lists (head_dim / 2 = 8 each), the attention factor and the
// original context; the long list applies when the context (128 here) exceeds the original.
TEST(ModelLoaderTest, Phi3LongRope) {
  TinyModelSpec spec;
  spec.arch = "phi3";
  spec.fused_qkv = true;
  spec.fused_gate_up = true;
  const std::vector<float> long_factors = {1, 1.5f, 2, 4, 8, 16, 32, 48};
  const std::vector<float> short_factors = {1, 1, 1, 1.1f, 1.2f, 1.3f, 1.4f, 1.5f};
  spec.f32_tensors["rope_factors_long.weight"] = long_factors;
  spec.f32_tensors["rope_factors_short.weight"] = short_factors;
  spec.kv_override["phi3.rope.scaling.attn_factor"] = F32(1.19f);
  spec.kv_override["phi3.rope.scaling.original_context_length"] = U32(32);
  absl::StatusOr<LoadedModel> m = LoadTiny(spec);
  ASSERT_TRUE(m.ok()) << m.status();
  const RopeScaling& r = m->config.rope_scaling;
  EXPECT_EQ(r.type, RopeScaling::Type::kLongRope);
  EXPECT_EQ(r.long_factors, long_factors);
  EXPECT_EQ(r.short_factors, short_factors);
  EXPECT_EQ(r.attn_factor, 1.19f);
  EXPECT_EQ(r.original_max_position, 32);
  EXPECT_TRUE(m->config.UsesLongRopeFactors());
  EXPECT_THAT(m->config.DebugString(), HasSubstr("rope_scaling=longrope(original=32 long"));

  // Without the original context it is the context itself: the short list, attn_factor 1.
  TinyModelSpec plain = spec;
  plain.kv_override.erase("phi3.rope.scaling.attn_factor");
  plain.kv_override.erase("phi3.rope.scaling.original_context_length");
  m = LoadTiny(plain);
  ASSERT_TRUE(m.ok()) << m.status();
  EXPECT_EQ(m->config.rope_scaling.original_max_position, 128);
  EXPECT_EQ(m->config.rope_scaling.attn_factor, 1.0f);
  EXPECT_FALSE(m->config.UsesLongRopeFactors());

  // Malformed lists are refused naming the tensor or the list and the entry.
  struct Bad {
    const char* name;
    std::function<void(TinyModelSpec*)> edit;
    const char* substring;
  };
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const Bad bad[] = {
      {"one list only", [](TinyModelSpec* s) { s->f32_tensors.erase("rope_factors_short.weight"); },
       "'rope_factors_short.weight' missing"},
      {"wrong length",
       [](TinyModelSpec* s) { s->f32_tensors["rope_factors_long.weight"].resize(6, 1.0f); },
       "'rope_factors_long.weight' (F32, 6 elements)"},
      {"zero", [](TinyModelSpec* s) { s->f32_tensors["rope_factors_long.weight"][2] = 0.0f; },
       "long_factor[2] must be positive and finite, got 0"},
      {"negative",
       [](TinyModelSpec* s) { s->f32_tensors["rope_factors_short.weight"][0] = -1.0f; },
       "short_factor[0] must be positive and finite"},
      {"nan", [nan](TinyModelSpec* s) { s->f32_tensors["rope_factors_short.weight"][7] = nan; },
       "short_factor[7] must be positive and finite"},
      {"attn_factor", [](TinyModelSpec* s) {
         s->kv_override["phi3.rope.scaling.attn_factor"] = F32(0.0f);
       }, "attn_factor must be positive"},
  };
  for (const Bad& b : bad) {
    SCOPED_TRACE(b.name);
    TinyModelSpec broken = spec;
    b.edit(&broken);
    absl::Status s = LoadTiny(broken).status();
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
    EXPECT_THAT(s.message(), HasSubstr(b.substring)) << s;
    EXPECT_THAT(s.message(), HasSubstr(kName)) << s;
  }
}

TEST(ModelLoaderTest, DispatchesOnGeneralArchitecture) {
  EXPECT_THAT(SupportedGgufArchitectures(),
              ::testing::ElementsAre("llama", "qwen2", "qwen3", "phi3", "gemma", "gemma2",
                                     "gemma3"));
  // Architectures people download that Tandem does not run yet: refused at load, by name.
  for (const char* arch : {"gemma3n", "phi2", "mistral3"}) {
    SCOPED_TRACE(arch);
    TinyModelSpec spec;
    spec.arch = arch;
    absl::Status s = LoadTiny(spec).status();
    EXPECT_EQ(s.code(), absl::StatusCode::kUnimplemented) << s;
    EXPECT_THAT(s.message(), HasSubstr(absl::StrCat("'", arch, "'")));
    EXPECT_THAT(s.message(), HasSubstr("llama, qwen2, qwen3, phi3, gemma, gemma2, gemma3"));
    EXPECT_THAT(s.message(), HasSubstr(kName));
  }
  absl::Status s;

  TinyModelSpec no_arch;
  no_arch.kv_override["general.architecture"] = std::nullopt;
  s = LoadTiny(no_arch).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kNotFound) << s;
  EXPECT_THAT(s.message(), HasSubstr("general.architecture"));
}

TEST(ModelLoaderTest, LoadsGemma) {
  TinyModelSpec spec;
  spec.arch = "gemma";
  spec.tied = false;  // llama.cpp multiplies by token_embd all the same
  absl::StatusOr<LoadedModel> m = LoadTiny(spec);
  ASSERT_TRUE(m.ok()) << m.status();
  const ModelConfig& c = m->config;
  EXPECT_FLOAT_EQ(c.embedding_scale, 8.0f);  // sqrt(64)
  EXPECT_EQ(c.ffn_activation, ModelConfig::Activation::kGeluTanh);
  EXPECT_TRUE(c.tie_word_embeddings);
  EXPECT_EQ(m->weights.output, m->weights.token_embd);
  EXPECT_TRUE(c.rope_neox);
  EXPECT_FALSE(c.post_norms);
  EXPECT_EQ(c.attn_logit_softcap, 0.0f);
  EXPECT_EQ(c.LayerWindow(0), 0);
}

TEST(ModelLoaderTest, LoadsGemma2WithItsDefaults) {
  TinyModelSpec spec;
  spec.arch = "gemma2";
  spec.layers = 4;
  spec.post_norms = true;
  absl::StatusOr<LoadedModel> m = LoadTiny(spec);
  ASSERT_TRUE(m.ok()) << m.status();
  const ModelConfig& c = m->config;
  // llama.cpp's defaults when the keys are absent.
  EXPECT_EQ(c.attn_logit_softcap, 50.0f);
  EXPECT_EQ(c.final_logit_softcap, 30.0f);
  EXPECT_EQ(c.sliding_window, 4096);
  EXPECT_THAT(c.sliding_layers, ::testing::ElementsAre(true, false, true, false));
  EXPECT_EQ(c.LayerWindow(0), 4096);
  EXPECT_EQ(c.LayerWindow(1), 0);
  EXPECT_FLOAT_EQ(c.attention_scale, 0.25f);  // 1 / sqrt(head_dim 16)
  EXPECT_TRUE(c.post_norms);
  ASSERT_NE(m->weights.layers[3].attn_post_norm, nullptr);
  ASSERT_NE(m->weights.layers[3].ffn_post_norm, nullptr);

  spec.kv_override["gemma2.attn_logit_softcapping"] = F32(20.0f);
  spec.kv_override["gemma2.attention.sliding_window"] = U32(8);
  spec.kv_override["gemma2.attention.sliding_window_pattern"] = U32(4);
  m = LoadTiny(spec);
  ASSERT_TRUE(m.ok()) << m.status();
  EXPECT_EQ(m->config.attn_logit_softcap, 20.0f);
  EXPECT_THAT(m->config.sliding_layers, ::testing::ElementsAre(true, true, true, false));
  EXPECT_EQ(m->config.LayerWindow(2), 8);

  // The post norms are required.
  spec.kv_override.clear();
  spec.skip_tensors = {"blk.2.post_ffw_norm.weight"};
  absl::Status s = LoadTiny(spec).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kNotFound) << s;
  EXPECT_THAT(s.message(), HasSubstr("'blk.2.post_ffw_norm.weight'"));
}

TEST(ModelLoaderTest, LoadsGemma3) {
  TinyModelSpec spec;
  spec.arch = "gemma3";
  spec.layers = 7;
  spec.post_norms = true;
  spec.qk_norms = true;
  absl::StatusOr<LoadedModel> m = LoadTiny(spec);
  ASSERT_TRUE(m.ok()) << m.status();
  // No window key: every layer attends fully.
  EXPECT_EQ(m->config.sliding_window, 0);
  EXPECT_EQ(m->config.rope_theta_sliding, 0.0f);
  EXPECT_EQ(m->config.attn_logit_softcap, 0.0f);
  EXPECT_EQ(m->config.final_logit_softcap, 0.0f);
  EXPECT_TRUE(m->config.qk_norm);

  spec.kv_override["gemma3.attention.sliding_window"] = U32(512);
  spec.kv_override["gemma3.final_logit_softcapping"] = F32(30.0f);
  spec.kv_override["gemma3.rope.scaling.type"] = Str("linear");
  spec.kv_override["gemma3.rope.scaling.factor"] = F32(8.0f);
  m = LoadTiny(spec);
  ASSERT_TRUE(m.ok()) << m.status();
  const ModelConfig& c = m->config;
  EXPECT_THAT(c.sliding_layers,
              ::testing::ElementsAre(true, true, true, true, true, false, true));
  EXPECT_EQ(c.rope_theta_sliding, 10000.0f);  // llama.cpp's default for the windowed layers
  EXPECT_EQ(c.final_logit_softcap, 30.0f);
  EXPECT_EQ(c.rope_scaling.type, RopeScaling::Type::kLinear);

  // One bool per layer.
  std::vector<GgufTestValue> pattern;
  for (int i = 0; i < 7; ++i) pattern.push_back(::tandem::testing::Bool(i % 3 == 0));
  spec.kv_override["gemma3.attention.sliding_window_pattern"] =
      ::tandem::testing::Arr(GgufValueType::kBool, pattern);
  spec.kv_override["gemma3.rope.freq_base_swa"] = F32(20000.0f);
  m = LoadTiny(spec);
  ASSERT_TRUE(m.ok()) << m.status();
  EXPECT_THAT(m->config.sliding_layers,
              ::testing::ElementsAre(true, false, false, true, false, false, true));
  EXPECT_EQ(m->config.rope_theta_sliding, 20000.0f);

  pattern.pop_back();
  spec.kv_override["gemma3.attention.sliding_window_pattern"] =
      ::tandem::testing::Arr(GgufValueType::kBool, pattern);
  absl::Status s = LoadTiny(spec).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  EXPECT_THAT(s.message(), HasSubstr("'gemma3.attention.sliding_window_pattern'"));

  // The vision tower is refused by name.
  TinyModelSpec vision;
  vision.arch = "gemma3";
  vision.post_norms = vision.qk_norms = true;
  vision.extra_tensors["v.patch_embd.weight"] = {16};
  s = LoadTiny(vision).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kUnimplemented) << s;
  EXPECT_THAT(s.message(), HasSubstr("'v.patch_embd.weight'"));
  EXPECT_THAT(s.message(), HasSubstr("vision"));
}

TEST(ModelLoaderTest, TensorErrorsNameTheTensorAndShapes) {
  struct Case {
    std::string tensor;
    std::vector<int64_t> wrong;  // empty: tensor missing
    std::string expected;        // the expected shape as printed
  };
  const Case cases[] = {
      {"token_embd.weight", {64, 41}, "{64, 40}"},
      {"output_norm.weight", {32}, "{64}"},
      {"blk.1.attn_k.weight", {64, 64}, "{64, 32}"},
      {"blk.0.attn_output.weight", {64, 32}, "{64, 64}"},
      {"blk.1.ffn_down.weight", {64, 96}, "{96, 64}"},
      {"blk.0.ffn_gate.weight", {64, 96, 1}, "{64, 96}"},
      {"blk.1.attn_norm.weight", {}, "{64}"},
      {"blk.0.ffn_up.weight", {}, "{64, 96}"},
      {"token_embd.weight", {}, "{64, 40}"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(absl::StrCat(c.tensor, c.wrong.empty() ? " missing" : " wrong shape"));
    TinyModelSpec spec;
    if (c.wrong.empty()) {
      spec.skip_tensors.insert(c.tensor);
    } else {
      spec.shape_override[c.tensor] = c.wrong;
    }
    absl::Status s = LoadTiny(spec).status();
    EXPECT_EQ(s.code(), c.wrong.empty() ? absl::StatusCode::kNotFound
                                        : absl::StatusCode::kInvalidArgument)
        << s;
    EXPECT_THAT(s.message(), HasSubstr(absl::StrCat("'", c.tensor, "'")));
    EXPECT_THAT(s.message(), HasSubstr(c.expected));
    if (!c.wrong.empty()) {
      std::string got = "got {";
      for (size_t i = 0; i < c.wrong.size(); ++i) absl::StrAppend(&got, i ? ", " : "", c.wrong[i]);
      EXPECT_THAT(s.message(), HasSubstr(got + "}"));
    }
  }
}

// block_count is read from the file: a count far past the layers the file has tensors for fails
// on the first missing tensor, without first allocating every layer (the gguf fuzz target's
// finding: a block_count of 846,595,818 asked for 100 GB).
TEST(ModelLoaderTest, ABlockCountPastTheTensorsFailsAtTheFirstMissingLayer) {
  for (const char* arch : {"llama", "phi3"}) {
    SCOPED_TRACE(arch);
    TinyModelSpec spec;
    spec.arch = arch;
    spec.fused_qkv = spec.fused_gate_up = spec.arch == "phi3";
    spec.kv_override[spec.arch + ".block_count"] = U32(4'000'000'000u);
    absl::Status s = LoadTiny(spec).status();
    EXPECT_EQ(s.code(), absl::StatusCode::kNotFound) << s;
    EXPECT_THAT(s.message(), HasSubstr("'blk.2.attn_norm.weight'"));
  }
}

TEST(ModelLoaderTest, MetadataErrorsAndRopeScaling) {
  struct Case {
    std::string name;
    std::map<std::string, std::optional<GgufTestValue>> kv;
    absl::StatusCode code;
    std::vector<std::string> substrings;
  };
  using C = absl::StatusCode;
  const Case cases[] = {
      {"missing block_count", {{"llama.block_count", std::nullopt}}, C::kNotFound,
       {"'llama.block_count'"}},
      {"head_count is a string", {{"llama.attention.head_count", Str("4")}}, C::kInvalidArgument,
       {"'llama.attention.head_count'", "got string"}},
      {"heads do not divide hidden", {{"llama.attention.head_count", U32(5)}},
       C::kInvalidArgument, {"num_heads 5 does not divide hidden_size 64"}},
      {"kv heads do not divide heads", {{"llama.attention.head_count_kv", U32(3)}},
       C::kInvalidArgument, {"num_kv_heads 3 does not divide num_heads 4"}},
      {"zero layers", {{"llama.block_count", U32(0)}}, C::kInvalidArgument,
       {"num_layers must be positive"}},
      {"zero context", {{"llama.context_length", U32(0)}}, C::kInvalidArgument,
       {"max_context"}},
      {"negative eps", {{"llama.attention.layer_norm_rms_epsilon", F32(-1.0f)}},
       C::kInvalidArgument, {"rms_norm_eps"}},
      {"partial rope", {{"llama.rope.dimension_count", U32(8)}}, C::kUnimplemented,
       {"llama.rope.dimension_count", "partial RoPE"}},
      {"yarn", {{"llama.rope.scaling.type", Str("yarn")}, {"llama.rope.scaling.factor", F32(4)}},
       C::kUnimplemented, {"'yarn'", "none, linear, llama3"}},
      {"sliding window pattern",
       {{"llama.attention.sliding_window", U32(16)},
        {"llama.attention.sliding_window_pattern", U32(2)}},
       C::kUnimplemented, {"'llama.attention.sliding_window_pattern'", "not supported"}},
      {"linear without factor", {{"llama.rope.scaling.type", Str("linear")}}, C::kNotFound,
       {"'llama.rope.scaling.factor'"}},
      {"vocab mismatch", {{"llama.vocab_size", U32(41)}, {"tokenizer.ggml.tokens", std::nullopt}},
       C::kInvalidArgument, {"'token_embd.weight'", "{64, 41}", "got {64, 40}"}},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    TinyModelSpec spec;
    spec.kv_override = c.kv;
    absl::Status s = LoadTiny(spec).status();
    EXPECT_EQ(s.code(), c.code) << s;
    for (const std::string& sub : c.substrings) EXPECT_THAT(s.message(), HasSubstr(sub)) << s;
  }

  TinyModelSpec linear;
  linear.kv_override = {{"llama.rope.scaling.type", Str("linear")},
                        {"llama.rope.scaling.factor", F32(2.0f)}};
  absl::StatusOr<LoadedModel> m = LoadTiny(linear);
  ASSERT_TRUE(m.ok()) << m.status();
  EXPECT_EQ(m->config.rope_scaling.type, RopeScaling::Type::kLinear);
  EXPECT_EQ(m->config.rope_scaling.factor, 2.0f);

  TinyModelSpec mistral;
  mistral.kv_override = {{"llama.attention.sliding_window", U32(4096)}};
  m = LoadTiny(mistral);
  ASSERT_TRUE(m.ok()) << m.status();
  EXPECT_EQ(m->config.sliding_window, 4096);
  EXPECT_EQ(LoadTiny(TinyModelSpec{})->config.sliding_window, 0);

  TinyModelSpec llama3;
  llama3.kv_override = {{"llama.rope.scaling.type", Str("llama3")},
                        {"llama.rope.scaling.factor", F32(8.0f)},
                        {"llama.rope.scaling.original_context_length", U32(8192)}};
  m = LoadTiny(llama3);
  ASSERT_TRUE(m.ok()) << m.status();
  EXPECT_EQ(m->config.rope_scaling.type, RopeScaling::Type::kLlama3);
  EXPECT_EQ(m->config.rope_scaling.factor, 8.0f);
  EXPECT_EQ(m->config.rope_scaling.low_freq_factor, 1.0f);
  EXPECT_EQ(m->config.rope_scaling.high_freq_factor, 4.0f);
  EXPECT_EQ(m->config.rope_scaling.original_max_position, 8192);
}

ModelConfig ValidConfig() {
  ModelConfig c;
  c.architecture = "llama";
  c.vocab_size = 100;
  c.hidden_size = 64;
  c.intermediate_size = 96;
  c.num_layers = 2;
  c.num_heads = 4;
  c.num_kv_heads = 2;
  c.head_dim = 16;
  c.max_context = 128;
  return c;
}

TEST(ModelConfigTest, ValidateNamesTheBadField) {
  ASSERT_TRUE(ValidConfig().Validate().ok());
  struct Case {
    std::string expect;  // in the message
    std::function<void(ModelConfig*)> edit;
  };
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const Case cases[] = {
      {"architecture is empty", [](ModelConfig* c) { c->architecture.clear(); }},
      {"vocab_size must be positive", [](ModelConfig* c) { c->vocab_size = 0; }},
      {"hidden_size must be positive", [](ModelConfig* c) { c->hidden_size = -64; }},
      {"intermediate_size", [](ModelConfig* c) { c->intermediate_size = 0; }},
      {"num_layers", [](ModelConfig* c) { c->num_layers = 0; }},
      {"num_heads must be positive", [](ModelConfig* c) { c->num_heads = 0; }},
      {"num_kv_heads must be positive", [](ModelConfig* c) { c->num_kv_heads = 0; }},
      {"head_dim must be positive", [](ModelConfig* c) { c->head_dim = 0; }},
      {"max_context", [](ModelConfig* c) { c->max_context = -1; }},
      {"num_heads 6 does not divide hidden_size 64", [](ModelConfig* c) { c->num_heads = 6; }},
      {"num_kv_heads 3 does not divide num_heads 4", [](ModelConfig* c) { c->num_kv_heads = 3; }},
      {"head_dim 15 must be even", [](ModelConfig* c) { c->head_dim = 15; }},
      {"rms_norm_eps", [](ModelConfig* c) { c->rms_norm_eps = 0; }},
      {"rms_norm_eps", [nan](ModelConfig* c) { c->rms_norm_eps = nan; }},
      {"rope_theta", [](ModelConfig* c) { c->rope_theta = -1; }},
      {"rope_theta", [](ModelConfig* c) { c->rope_theta = INFINITY; }},
      {"rope scaling factor",
       [](ModelConfig* c) {
         c->rope_scaling.type = RopeScaling::Type::kLinear;
         c->rope_scaling.factor = 0;
       }},
      {"low_freq_factor",
       [](ModelConfig* c) {
         c->rope_scaling.type = RopeScaling::Type::kLlama3;
         c->rope_scaling.factor = 8;
         c->rope_scaling.low_freq_factor = 4;
         c->rope_scaling.high_freq_factor = 4;
       }},
      {"sliding_window must be >= 0", [](ModelConfig* c) { c->sliding_window = -1; }},
      {"original_max_position",
       [](ModelConfig* c) {
         c->rope_scaling.type = RopeScaling::Type::kLlama3;
         c->rope_scaling.original_max_position = 0;
       }},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.expect);
    ModelConfig config = ValidConfig();
    c.edit(&config);
    absl::Status s = config.Validate();
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
    EXPECT_THAT(s.message(), HasSubstr(c.expect)) << s;
  }
}

// The default model shipped with the project (a real GGUF v3 file written by llama.cpp).
TEST(ModelLoaderTest, LoadsTheDefaultSmolLM2Model) {
  const std::string path =
      absl::StrCat(TANDEM_TEST_SOURCE_DIR, "/models/SmolLM2-135M-Instruct.Q4_1.gguf");
  absl::StatusOr<LoadedModel> m = LoadGgufModel(path);
  ASSERT_TRUE(m.ok()) << m.status();
  const ModelConfig& c = m->config;
  EXPECT_EQ(c.architecture, "llama");
  EXPECT_EQ(c.num_layers, 30);
  EXPECT_EQ(c.hidden_size, 576);
  EXPECT_EQ(c.num_heads, 9);
  EXPECT_EQ(c.num_kv_heads, 3);
  EXPECT_EQ(c.head_dim, 64);
  EXPECT_EQ(c.intermediate_size, 1536);
  EXPECT_EQ(c.vocab_size, 49152);
  EXPECT_EQ(c.max_context, 8192);
  EXPECT_FLOAT_EQ(c.rope_theta, 100000.0f);
  EXPECT_FLOAT_EQ(c.rms_norm_eps, 1e-5f);
  EXPECT_TRUE(c.tie_word_embeddings);
  EXPECT_FALSE(c.attention_bias);
  EXPECT_FALSE(c.rope_neox);  // llama.cpp permuted the Q/K rows for interleaved pairs
  EXPECT_EQ(m->weights.output, m->weights.token_embd);
  EXPECT_EQ(m->weights.token_embd->type, DType::kQ8_0);
  EXPECT_EQ(m->weights.output_norm->type, DType::kF32);
  ASSERT_EQ(m->weights.layers.size(), 30u);
  for (const LayerWeights& l : m->weights.layers) {
    EXPECT_EQ(l.attn_q->type, DType::kQ4_1);
    EXPECT_EQ(l.ffn_down->type, DType::kQ4_1);
    EXPECT_EQ(l.attn_norm->type, DType::kF32);
  }
  EXPECT_EQ(*m->file->GetString("tokenizer.ggml.pre"), "smollm");
  EXPECT_EQ(m->file->GetStringArray("tokenizer.ggml.merges")->size(), 48900u);
}

}  // namespace
}  // namespace tandem
