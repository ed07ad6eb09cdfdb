#include "engine/runtime/backend.h"

#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/logging.h"
#include "common/version.h"
#include "engine/runtime/cpu_backend.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace tandem {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

const LoadedModel& DefaultModel() {
  static const LoadedModel* model = [] {
    auto loaded =
        LoadGgufModel(absl::StrCat(kSourceDir, "/models/SmolLM2-135M-Instruct.Q4_1.gguf"));
    CHECK(loaded.ok()) << loaded.status();
    return new LoadedModel(std::move(*loaded));
  }();
  return *model;
}

TEST(CheckSupportTest, ABackendThatLacksWhatTheModelNeedsSaysWhat) {
  const LoadedModel& model = DefaultModel();  // Q4_1 matrices (Q8_0 or F16 output), head dim 64
  EXPECT_TRUE(CheckSupport(CpuBackend::Support(), model, DType::kF16).ok());

  BackendSupport no_q4_1 = CpuBackend::Support();
  no_q4_1.name = "test";
  std::erase(no_q4_1.weight_types, DType::kQ4_1);
  absl::Status s = CheckSupport(no_q4_1, model, DType::kF16);
  EXPECT_EQ(s.code(), absl::StatusCode::kUnimplemented);
  EXPECT_THAT(s.message(), HasSubstr("the test backend cannot multiply"));
  EXPECT_THAT(s.message(), HasSubstr("Q4_1"));

  BackendSupport head_dims = CpuBackend::Support();
  head_dims.head_dims = {128};
  s = CheckSupport(head_dims, model, DType::kF16);
  EXPECT_EQ(s.code(), absl::StatusCode::kUnimplemented);
  EXPECT_THAT(s.message(), HasSubstr("head dimension 64"));

  BackendSupport f32_kv = CpuBackend::Support();
  f32_kv.kv_types = {DType::kF32};
  s = CheckSupport(f32_kv, model, DType::kF16);
  EXPECT_EQ(s.code(), absl::StatusCode::kUnimplemented);
  EXPECT_THAT(s.message(), HasSubstr("F16 KV"));
  // The CPU backend refuses such a KV type at creation too.
  EXPECT_EQ(CpuBackend::Create(&model, {.kv_dtype = DType::kQ4_0}).status().code(),
            absl::StatusCode::kUnimplemented);

  // The CPU backend's support less one capability, and the default model made another family.
  auto lacking = [](bool BackendSupport::*capability) {
    BackendSupport support = CpuBackend::Support();
    support.name = "test";
    support.*capability = false;
    return support;
  };
  auto as = [&](const char* architecture) {
    LoadedModel variant;
    variant.config = model.config;
    variant.config.architecture = architecture;
    return variant;
  };

  // A backend without Gemma's layer (the CUDA kernels have none) names what a Gemma model needs.
  const BackendSupport no_gemma = lacking(&BackendSupport::gemma_layers);
  EXPECT_TRUE(CheckSupport(no_gemma, model, DType::kF16).ok());
  LoadedModel gemma = as("gemma2");
  gemma.config.attn_logit_softcap = 50.0f;
  s = CheckSupport(no_gemma, gemma, DType::kF16);
  EXPECT_EQ(s.code(), absl::StatusCode::kUnimplemented);
  EXPECT_THAT(s.message(), HasSubstr("the test backend cannot run gemma2"));
  EXPECT_THAT(s.message(), HasSubstr("attention logit soft-capping"));

  // Nor LongRoPE (Phi-3 128k) without the backend saying it applies it.
  const BackendSupport no_long_rope = lacking(&BackendSupport::long_rope);
  EXPECT_TRUE(CheckSupport(no_long_rope, model, DType::kF16).ok());
  LoadedModel phi3 = as("phi3");
  phi3.config.rope_scaling.type = RopeScaling::Type::kLongRope;
  EXPECT_TRUE(CheckSupport(CpuBackend::Support(), phi3, DType::kF16).ok());
  s = CheckSupport(no_long_rope, phi3, DType::kF16);
  EXPECT_EQ(s.code(), absl::StatusCode::kUnimplemented);
  EXPECT_THAT(s.message(), HasSubstr("the test backend cannot run phi3: it lacks LongRoPE"));
}

TEST(PlanStepTest, FlattensTheBatchForTheKernels) {
  const ModelConfig& c = DefaultModel().config;
  const KvLayout kv{.num_blocks = 16, .num_layers = c.num_layers, .block_size = 4,
                    .num_kv_heads = c.num_kv_heads, .head_dim = c.head_dim};
  const std::vector<int32_t> prompt = {5, 6, 7, 8, 9}, decode = {42};
  const std::vector<int32_t> table_a = {3, 1}, table_b = {7, 2, 9};
  StepBatch batch;
  batch.sequences.push_back({.tokens = prompt, .start_position = 0, .block_table = table_a,
                             .compute_logits = false});  // a chunk that is not the prompt's last
  batch.sequences.push_back({.tokens = decode, .start_position = 10, .block_table = table_b});
  batch.on_layer_done = [](int64_t) {};
  StepPlan plan;
  ASSERT_TRUE(PlanStep(c, batch, kv, &plan).ok());
  EXPECT_EQ(plan.num_tokens, 6);
  EXPECT_EQ(plan.num_sequences, 2);
  EXPECT_THAT(plan.token_ids, ElementsAre(5, 6, 7, 8, 9, 42));
  EXPECT_THAT(plan.token_seq, ElementsAre(0, 0, 0, 0, 0, 1));
  EXPECT_THAT(plan.token_pos, ElementsAre(0, 1, 2, 3, 4, 10));
  EXPECT_THAT(plan.seq_lens, ElementsAre(5, 11));
  EXPECT_EQ(plan.max_blocks_per_seq, 3);
  EXPECT_THAT(plan.block_tables, ElementsAre(3, 1, 0, 7, 2, 9));
  EXPECT_THAT(plan.logit_rows, ElementsAre(5));
  EXPECT_EQ(plan.on_layer_done, &batch.on_layer_done);

  // A smaller step after it leaves nothing of the larger one behind.
  StepBatch one;
  one.sequences.push_back({.tokens = decode, .start_position = 3, .block_table = table_a});
  ASSERT_TRUE(PlanStep(c, one, kv, &plan).ok());
  EXPECT_THAT(plan.token_ids, ElementsAre(42));
  EXPECT_THAT(plan.block_tables, ElementsAre(3, 1));
  EXPECT_THAT(plan.logit_rows, ElementsAre(0));

  // A table that does not reach the step's last position.
  StepBatch short_table;
  short_table.sequences.push_back({.tokens = decode, .start_position = 8, .block_table = table_a});
  EXPECT_EQ(PlanStep(c, short_table, kv, &plan).code(), absl::StatusCode::kInvalidArgument);
}

TEST(BackendTest, TheLayersRunOneByOneGiveWhatStepGives) {
  auto backend = CpuBackend::Create(&DefaultModel(), {.num_threads = 2});
  ASSERT_TRUE(backend.ok()) << backend.status();
  Backend& b = **backend;
  auto kv = KvStorage::Create(b.KvLayoutFor(8));
  ASSERT_TRUE(kv.ok());
  const std::vector<int32_t> prompt = {1, 9690, 198, 2683, 359, 253, 5356, 5646};
  const std::vector<int32_t> blocks = {0};
  StepBatch batch;
  batch.sequences.push_back({.tokens = prompt, .start_position = 0, .block_table = blocks});
  std::vector<int64_t> layers_done;
  batch.on_layer_done = [&](int64_t l) { layers_done.push_back(l); };

  StepOutput whole;
  ASSERT_TRUE(b.Step(batch, kv->get(), &whole).ok());
  ASSERT_EQ(static_cast<int64_t>(layers_done.size()), b.config().num_layers);

  layers_done.clear();
  StepOutput phased;
  ASSERT_TRUE(b.Plan(batch, **kv).ok());
  ASSERT_TRUE(b.Embed(nullptr).ok());
  for (int64_t l = 0; l < b.config().num_layers; ++l) {
    ASSERT_TRUE(b.RunLayer(l, kv->get(), nullptr).ok());
    ASSERT_EQ(static_cast<int64_t>(layers_done.size()), l + 1) << "layer " << l << " not reported";
  }
  ASSERT_TRUE(b.Finish(&phased, nullptr).ok());
  EXPECT_EQ(phased.logits, whole.logits);
}

}  // namespace
}  // namespace tandem
