#include "kvtransfer/prompt_write_plan.h"

#include <map>
#include <utility>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace tandem::kvtransfer {
namespace {

constexpr int64_t kBlockSize = 4;
constexpr int64_t kLayers = 3;

// Source block k is 100 + k, destination block k is 200 + k: a pair shows its logical block.
std::vector<int32_t> Source(int64_t n) {
  std::vector<int32_t> b;
  for (int64_t k = 0; k < n; ++k) b.push_back(static_cast<int32_t>(100 + k));
  return b;
}
std::vector<int32_t> Destination(int64_t n) {
  std::vector<int32_t> b;
  for (int64_t k = 0; k < n; ++k) b.push_back(static_cast<int32_t>(200 + k));
  return b;
}

PromptWritePlan Plan(int64_t prompt_blocks, int64_t destination_cached_tokens) {
  auto plan = PromptWritePlan::Create({.block_size = kBlockSize,
                                       .num_layers = kLayers,
                                       .destination_cached_tokens = destination_cached_tokens,
                                       .destination_blocks = Destination(prompt_blocks)});
  EXPECT_TRUE(plan.ok()) << plan.status();
  return *std::move(plan);
}

// How many times each (logical block, layer) is written, over the ops of one or more steps.
using Coverage = std::map<std::pair<int64_t, int64_t>, int>;

// Runs a step over every layer, as the engine calls on_kv_layer, and adds its writes to `cov`.
void Step(PromptWritePlan& plan, int64_t first, int64_t n, const std::vector<int32_t>& src,
          Coverage* cov) {
  for (int64_t layer = 0; layer < kLayers; ++layer) {
    for (const WriteOp& op : plan.OnLayer(layer, first, n, src)) {
      ASSERT_FALSE(op.blocks.empty());
      for (const BlockPair& p : op.blocks) {
        ASSERT_EQ(p.src - 100, p.dst - 200) << "a block went to another block's place";
        for (int32_t l = op.first_layer; l < op.first_layer + op.num_layers; ++l) {
          ++(*cov)[{p.src - 100, l}];
        }
      }
    }
  }
}

// Every layer of blocks [from, to) written exactly `times`, nothing else.
Coverage Each(int64_t from, int64_t to, int times = 1) {
  Coverage c;
  for (int64_t k = from; k < to; ++k) {
    for (int64_t l = 0; l < kLayers; ++l) c[{k, l}] = times;
  }
  return c;
}

TEST(PromptWritePlanTest, OneStepWritesEveryBlockOnceLayerByLayer) {
  PromptWritePlan plan = Plan(3, 0);
  const std::vector<int32_t> src = Source(3);
  std::vector<WriteOp> layer1 = plan.OnLayer(1, 0, 10, src);
  ASSERT_EQ(layer1.size(), 1u);
  EXPECT_EQ(layer1[0].first_layer, 1);
  EXPECT_EQ(layer1[0].num_layers, 1);
  EXPECT_EQ(layer1[0].blocks.size(), 3u);  // the partial third block too

  PromptWritePlan again = Plan(3, 0);
  Coverage cov;
  Step(again, 0, 10, src, &cov);
  EXPECT_EQ(cov, Each(0, 3));
  EXPECT_EQ(again.planned_tokens(), 10);
}

TEST(PromptWritePlanTest, BlocksTheDestinationCachesAreNeverWritten) {
  PromptWritePlan plan = Plan(4, 8);
  Coverage cov;
  Step(plan, 0, 14, Source(4), &cov);  // this worker computed them all the same
  EXPECT_EQ(cov, Each(2, 4));
}

TEST(PromptWritePlanTest, BlocksFromThisWorkersOwnCacheGoWholeOnceWithTheFirstLayer) {
  PromptWritePlan plan = Plan(5, 4);
  const std::vector<int32_t> src = Source(5);
  // Blocks 0-2 came from the prefix cache here; the destination caches block 0.
  std::vector<WriteOp> first = plan.OnLayer(0, 12, 6, src);
  ASSERT_EQ(first.size(), 2u);
  EXPECT_EQ(first[0].first_layer, 0);
  EXPECT_EQ(first[0].num_layers, kLayers);
  ASSERT_EQ(first[0].blocks.size(), 2u);
  EXPECT_EQ(first[0].blocks[0].src, 101);
  EXPECT_EQ(first[0].blocks[1].src, 102);

  PromptWritePlan again = Plan(5, 4);
  Coverage cov;
  Step(again, 12, 6, src, &cov);
  EXPECT_EQ(cov, Each(1, 5));
}

TEST(PromptWritePlanTest, ChunkedPrefillSendsNothingTwiceButTheBlockTheChunksShare) {
  PromptWritePlan plan = Plan(5, 0);
  const std::vector<int32_t> src = Source(5);
  Coverage cov;
  Step(plan, 4, 6, src, &cov);   // block 0 from this worker's cache; computes 4..9
  Step(plan, 10, 8, src, &cov);  // 10..17: block 2 (8..11) was half written by the first chunk
  Coverage want = Each(0, 5);
  for (int64_t l = 0; l < kLayers; ++l) want[{2, l}] = 2;
  EXPECT_EQ(cov, want);
  EXPECT_EQ(plan.planned_tokens(), 18);
}

TEST(PromptWritePlanTest, ARecomputeThatFindsMoreCachedSendsTheGapWhole) {
  PromptWritePlan plan = Plan(6, 0);
  const std::vector<int32_t> src = Source(6);
  Coverage cov;
  Step(plan, 0, 6, src, &cov);  // 0..5, then the sequence is preempted
  // Readmitted, it finds blocks 0-3 cached (another request computed 6..15 meanwhile).
  Step(plan, 16, 6, src, &cov);
  Coverage want = Each(0, 6);
  for (int64_t l = 0; l < kLayers; ++l) want[{1, l}] = 2;  // half written, then whole
  EXPECT_EQ(cov, want);
}

TEST(PromptWritePlanTest, ARecomputeFromTheStartWritesAgainWithoutWholeBlocks) {
  PromptWritePlan plan = Plan(2, 0);
  const std::vector<int32_t> src = Source(2);
  Coverage cov;
  Step(plan, 0, 8, src, &cov);
  Step(plan, 0, 8, src, &cov);  // preempted after the step, recomputed from nothing cached
  EXPECT_EQ(cov, Each(0, 2, 2));
}

TEST(PromptWritePlanTest, BadOptionsAreRefused) {
  using Options = PromptWritePlan::Options;
  for (const Options& o : {
           Options{.block_size = 0, .num_layers = 1, .destination_blocks = {1}},
           Options{.block_size = 4, .num_layers = 0, .destination_blocks = {1}},
           Options{.block_size = 4, .num_layers = 1, .destination_cached_tokens = 2,
                   .destination_blocks = {1}},
           Options{.block_size = 4, .num_layers = 1, .destination_cached_tokens = -4,
                   .destination_blocks = {1}},
           Options{.block_size = 4, .num_layers = 1, .destination_cached_tokens = 8,
                   .destination_blocks = {1}},
       }) {
    EXPECT_EQ(PromptWritePlan::Create(o).status().code(), absl::StatusCode::kInvalidArgument)
        << o.block_size << " " << o.num_layers << " " << o.destination_cached_tokens;
  }
}

}  // namespace
}  // namespace tandem::kvtransfer
