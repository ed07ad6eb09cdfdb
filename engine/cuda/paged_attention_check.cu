// Checks of the paged attention kernels (paged_attention.h) against a plain CPU reference written
// here (double accumulation, full softmax per (token, head)), over random batches: shuffled
// physical blocks, random cached prefixes and chunk sizes, decode tokens and prefill chunks of
// several sequences in one step, GQA ratios 1, 4 and 8, head dims 64 and 128, block sizes 16 and
// 32, contexts from 1 to 5000 (so KV ranges are split and merged), F32 and F16 caches.
//
// Tolerances (|got - want| <= abs + rel * |want|, element-wise):
//  - kKernelAbs / kKernelRel = 1e-5 / 1e-3 against the reference on the cache's own values (for an
//    F16 cache: the halves, widened exactly). The kernels compute in float what the reference
//    computes in double, so this holds for both cache types: a paging, masking or merging bug
//    moves outputs by far more.
//  - kHalfAbs / kHalfRel = 1e-3 / 1e-2 between an F16 cache's result and the reference on the
//    unrounded float K/V: what rounding K/V to half may cost (2^-11 relative per element).
// Slots that no sequence owns, the block tables' unused entries and the padding between q rows
// hold NaN / -1, so a read outside the ranges shows; out's padding must stay untouched.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "engine/cuda/check.h"
#include "engine/cuda/paged_attention.h"

namespace tandem::cuda {
namespace {

using check::DeviceBuffer;

constexpr double kKernelAbs = 1e-5;
constexpr double kKernelRel = 1e-3;
constexpr double kHalfAbs = 1e-3;
constexpr double kHalfRel = 1e-2;
constexpr float kOutSentinel = -12345.0f;

TANDEM_CHECK_CASE(PagedAttentionHalfConversionRoundsToNearestEven) {
  CHECK_TRUE(check::FloatToHalfBits(1.0f) == 0x3c00 && check::FloatToHalfBits(-2.0f) == 0xc000);
  CHECK_TRUE(check::FloatToHalfBits(65504.0f) == 0x7bff && check::FloatToHalfBits(65520.0f) == 0x7c00);
  CHECK_TRUE(check::FloatToHalfBits(1.0f + 1.0f / 2048) == 0x3c00);        // tie to even (down)
  CHECK_TRUE(check::FloatToHalfBits(1.0f + 3.0f / 2048) == 0x3c02);        // tie to even (up)
  CHECK_TRUE(check::FloatToHalfBits(std::ldexp(1.0f, -24)) == 0x0001);     // smallest subnormal
  CHECK_TRUE(check::FloatToHalfBits(std::ldexp(1.0f, -25)) == 0x0000);     // tie to even: zero
  CHECK_TRUE(check::FloatToHalfBits(std::ldexp(1023.5f, -24)) == 0x0400);  // up to the first normal
  for (uint32_t h = 0; h < 0x7c00u; ++h) {  // every finite half survives the round trip
    const uint16_t half = static_cast<uint16_t>(h);
    CHECK_TRUE(check::FloatToHalfBits(check::HalfBitsToFloat(half)) == half);
    CHECK_TRUE(check::FloatToHalfBits(-check::HalfBitsToFloat(half)) == (half | 0x8000u));
  }
}

// A sequence of the step: `prefix` positions already cached, then `chunk` new tokens (1: a decode
// token), each drawn uniformly from its range.
struct SeqRange {
  int prefix_lo, prefix_hi;
  int chunk_lo, chunk_hi;
};

struct AttentionCase {
  const char* what;
  int64_t num_heads, num_kv_heads, head_dim, block_size;
  KvCacheType kv_type;
  std::vector<SeqRange> seqs;
  AttentionPlanOptions options;
  int expect_split;     // 1: the plan must split something; 0: must not; -1: either
  bool shuffle_tokens;  // the step's tokens in random order (one segment each, mostly)
  bool vs_unrounded;    // F16: also compare with the reference on the unrounded K/V
  float q_scale;        // q uniform in [-q_scale, q_scale]
  float scale;          // params.scale (0: 1 / sqrt(head_dim))
  uint32_t seed;
};

constexpr int kLayers = 2;  // the cache holds two layers; the kernels run on layer 1

// A random step and its cache, on the host, in docs/kv_layout.md's layout.
struct Batch {
  int64_t num_seqs = 0, max_blocks = 0, num_blocks = 0;
  std::vector<int32_t> block_tables, token_seq, token_pos;
  std::vector<float> region_f32;     // the cache's values as floats (the halves', for F16)
  std::vector<float> unrounded;      // F16: the values before rounding
  std::vector<uint16_t> region_f16;  // F16: the cache itself
  std::vector<float> q;
  int64_t q_stride = 0, out_stride = 0;
  int64_t block_stride = 0, token_stride = 0, kv_stride = 0, layer_offset = 0;
};

Batch MakeBatch(const AttentionCase& c, std::mt19937& rng) {
  Batch b;
  const int64_t B = c.block_size, H = c.num_kv_heads, D = c.head_dim;
  b.num_seqs = static_cast<int64_t>(c.seqs.size());
  std::vector<int> prefix, chunk, ctx;
  for (const SeqRange& s : c.seqs) {
    prefix.push_back(std::uniform_int_distribution<int>(s.prefix_lo, s.prefix_hi)(rng));
    chunk.push_back(std::uniform_int_distribution<int>(s.chunk_lo, s.chunk_hi)(rng));
    ctx.push_back(prefix.back() + chunk.back());
  }
  for (int n : ctx) b.max_blocks = std::max<int64_t>(b.max_blocks, (n + B - 1) / B);
  b.max_blocks += 1;  // an unused entry per row (-1)
  for (int n : ctx) b.num_blocks += (n + B - 1) / B;
  b.num_blocks += 3;  // blocks no sequence owns
  std::vector<int32_t> physical(static_cast<size_t>(b.num_blocks));
  std::iota(physical.begin(), physical.end(), 0);
  std::shuffle(physical.begin(), physical.end(), rng);
  b.block_tables.assign(static_cast<size_t>(b.num_seqs * b.max_blocks), -1);
  size_t next = 0;
  for (int64_t s = 0; s < b.num_seqs; ++s) {
    for (int64_t k = 0; k < (ctx[s] + B - 1) / B; ++k) {
      b.block_tables[static_cast<size_t>(s * b.max_blocks + k)] = physical[next++];
    }
  }

  b.token_stride = H * D;
  b.kv_stride = B * H * D;
  b.block_stride = kLayers * 2 * b.kv_stride;
  b.layer_offset = 1 * 2 * b.kv_stride;  // layer 1's K in block 0
  const size_t elements = static_cast<size_t>(b.num_blocks * b.block_stride);
  b.region_f32.assign(elements, std::numeric_limits<float>::quiet_NaN());
  const bool f16 = c.kv_type == KvCacheType::kF16;
  if (f16) {
    b.region_f16.assign(elements, 0x7e00);  // NaN
    b.unrounded.assign(elements, std::numeric_limits<float>::quiet_NaN());
  }
  std::uniform_real_distribution<float> unit(-1.0f, 1.0f);
  for (int64_t s = 0; s < b.num_seqs; ++s) {
    for (int64_t pos = 0; pos < ctx[s]; ++pos) {
      const int64_t block = b.block_tables[static_cast<size_t>(s * b.max_blocks + pos / B)];
      for (int64_t kv = 0; kv < 2; ++kv) {
        const int64_t row =
            block * b.block_stride + b.layer_offset + kv * b.kv_stride + (pos % B) * b.token_stride;
        for (int64_t e = 0; e < H * D; ++e) {
          const float x = unit(rng);
          const size_t at = static_cast<size_t>(row + e);
          if (f16) {
            b.unrounded[at] = x;
            b.region_f16[at] = check::FloatToHalfBits(x);
            b.region_f32[at] = check::HalfBitsToFloat(b.region_f16[at]);
          } else {
            b.region_f32[at] = x;
          }
        }
      }
    }
  }

  for (int64_t s = 0; s < b.num_seqs; ++s) {
    for (int i = 0; i < chunk[s]; ++i) {
      b.token_seq.push_back(static_cast<int32_t>(s));
      b.token_pos.push_back(prefix[s] + i);
    }
  }
  if (c.shuffle_tokens) {
    std::vector<size_t> order(b.token_seq.size());
    std::iota(order.begin(), order.end(), 0);
    std::shuffle(order.begin(), order.end(), rng);
    std::vector<int32_t> seq, pos;
    for (size_t i : order) {
      seq.push_back(b.token_seq[i]);
      pos.push_back(b.token_pos[i]);
    }
    b.token_seq = std::move(seq);
    b.token_pos = std::move(pos);
  }

  const int64_t T = static_cast<int64_t>(b.token_seq.size());
  b.q_stride = c.num_heads * D + 8;  // padding (NaN) between tokens
  b.out_stride = c.num_heads * D + 4;
  b.q.assign(static_cast<size_t>(T * b.q_stride), std::numeric_limits<float>::quiet_NaN());
  std::uniform_real_distribution<float> qdist(-c.q_scale, c.q_scale);
  for (int64_t t = 0; t < T; ++t) {
    for (int64_t e = 0; e < c.num_heads * D; ++e) {
      b.q[static_cast<size_t>(t * b.q_stride + e)] = qdist(rng);
    }
  }
  return b;
}

// The ground truth: per (token, head), every score in double, the full softmax, the weighted V,
// reading `region` (floats, the layout of the cache) through the block tables. [T, num_heads * D].
std::vector<float> Reference(const AttentionCase& c, const Batch& b,
                             const std::vector<float>& region) {
  const int64_t D = c.head_dim, B = c.block_size;
  const int64_t group = c.num_heads / c.num_kv_heads;
  const double scale = c.scale != 0.0f ? c.scale : 1.0 / std::sqrt(static_cast<double>(D));
  const int64_t T = static_cast<int64_t>(b.token_seq.size());
  std::vector<float> want(static_cast<size_t>(T * c.num_heads * D));
  std::vector<double> scores, o(static_cast<size_t>(D));
  std::vector<int64_t> rows;
  for (int64_t t = 0; t < T; ++t) {
    const int64_t s = b.token_seq[static_cast<size_t>(t)];
    const int64_t ctx = b.token_pos[static_cast<size_t>(t)] + 1;
    rows.resize(static_cast<size_t>(ctx));
    for (int64_t pos = 0; pos < ctx; ++pos) {
      const int64_t block = b.block_tables[static_cast<size_t>(s * b.max_blocks + pos / B)];
      rows[static_cast<size_t>(pos)] =
          block * b.block_stride + b.layer_offset + (pos % B) * b.token_stride;
    }
    for (int64_t h = 0; h < c.num_heads; ++h) {
      const int64_t head = (h / group) * D;
      const float* q = b.q.data() + t * b.q_stride + h * D;
      scores.resize(static_cast<size_t>(ctx));
      double max = -std::numeric_limits<double>::infinity();
      for (int64_t pos = 0; pos < ctx; ++pos) {
        const float* k = region.data() + rows[static_cast<size_t>(pos)] + head;
        double dot = 0.0;
        for (int64_t d = 0; d < D; ++d) dot += static_cast<double>(q[d]) * k[d];
        scores[static_cast<size_t>(pos)] = dot * scale;
        max = std::max(max, dot * scale);
      }
      double sum = 0.0;
      for (double& x : scores) {
        x = std::exp(x - max);
        sum += x;
      }
      std::fill(o.begin(), o.end(), 0.0);
      for (int64_t pos = 0; pos < ctx; ++pos) {
        const float* v = region.data() + rows[static_cast<size_t>(pos)] + b.kv_stride + head;
        const double w = scores[static_cast<size_t>(pos)] / sum;
        for (int64_t d = 0; d < D; ++d) o[static_cast<size_t>(d)] += w * v[d];
      }
      for (int64_t d = 0; d < D; ++d) {
        want[static_cast<size_t>((t * c.num_heads + h) * D + d)] =
            static_cast<float>(o[static_cast<size_t>(d)]);
      }
    }
  }
  return want;
}

void RunCase(const AttentionCase& c) {
  std::mt19937 rng(c.seed);
  const Batch b = MakeBatch(c, rng);
  const int64_t T = static_cast<int64_t>(b.token_seq.size());
  const int64_t D = c.head_dim;

  AttentionPlanInput input;
  input.token_seq = b.token_seq.data();
  input.token_pos = b.token_pos.data();
  input.num_tokens = T;
  input.num_heads = c.num_heads;
  input.num_kv_heads = c.num_kv_heads;
  input.head_dim = D;
  AttentionPlan plan;
  CHECK_CUDA(PlanAttention(input, c.options, &plan));
  if (c.expect_split >= 0) CHECK_TRUE((plan.kv_chunk > 0) == (c.expect_split == 1));
  CHECK_TRUE(plan.kv_chunk > 0 || plan.merge_rows.empty());
  std::printf(
      "  %s: %lld tokens, %zu wide + %zu narrow blocks x %lld KV heads, kv_chunk %lld, "
      "%zu merged rows\n",
      c.what, static_cast<long long>(T), plan.wide_items.size(), plan.narrow_items.size(),
      static_cast<long long>(c.num_kv_heads), static_cast<long long>(plan.kv_chunk),
      plan.merge_rows.size());

  const bool f16 = c.kv_type == KvCacheType::kF16;
  DeviceBuffer<float> cache_f32(f16 ? 0 : b.region_f32.size());
  DeviceBuffer<uint16_t> cache_f16(f16 ? b.region_f16.size() : 0);
  if (f16) {
    cache_f16.Upload(b.region_f16);
  } else {
    cache_f32.Upload(b.region_f32);
  }
  DeviceBuffer<int32_t> tables(b.block_tables), seq(b.token_seq), pos(b.token_pos);
  DeviceBuffer<float> q(b.q);
  std::vector<float> out_init(static_cast<size_t>(T * b.out_stride), kOutSentinel);
  DeviceBuffer<float> out(out_init);
  DeviceBuffer<char> workspace(plan.workspace_bytes);
  CHECK_TRUE(plan.workspace_bytes == 0 || workspace.get() != nullptr);

  PagedAttentionParams p;
  p.q = q.get();
  p.q_token_stride = b.q_stride;
  p.out = out.get();
  p.out_token_stride = b.out_stride;
  const int64_t element_bytes = f16 ? 2 : 4;
  const char* base = f16 ? reinterpret_cast<const char*>(cache_f16.get())
                         : reinterpret_cast<const char*>(cache_f32.get());
  p.k_cache = base + b.layer_offset * element_bytes;
  p.v_cache = base + (b.layer_offset + b.kv_stride) * element_bytes;
  p.kv_type = c.kv_type;
  p.block_stride = b.block_stride;
  p.token_stride = b.token_stride;
  p.kv_head_stride = D;
  p.block_size = c.block_size;
  p.block_tables = tables.get();
  p.max_blocks_per_seq = b.max_blocks;
  p.token_seq = seq.get();
  p.token_pos = pos.get();
  p.num_tokens = T;
  p.num_heads = c.num_heads;
  p.num_kv_heads = c.num_kv_heads;
  p.head_dim = D;
  p.scale = c.scale;

  cudaStream_t stream = nullptr;
  CHECK_CUDA(cudaStreamCreate(&stream));
  CHECK_CUDA(UploadAttentionPlan(plan, workspace.get(), plan.workspace_bytes, stream));
  // Twice: the plan serves every layer, and nothing of one run leaks into the next.
  CHECK_CUDA(PagedAttention(p, plan, workspace.get(), plan.workspace_bytes, stream));
  CHECK_CUDA(cudaStreamSynchronize(stream));
  const std::vector<float> first = out.Download();
  out.Upload(out_init);
  CHECK_CUDA(PagedAttention(p, plan, workspace.get(), plan.workspace_bytes, stream));
  CHECK_CUDA(cudaStreamSynchronize(stream));
  CHECK_CUDA(cudaStreamDestroy(stream));
  const std::vector<float> all = out.Download();
  CHECK_TRUE(std::memcmp(first.data(), all.data(), all.size() * sizeof(float)) == 0);

  std::vector<float> got(static_cast<size_t>(T * c.num_heads * D));
  for (int64_t t = 0; t < T; ++t) {
    std::copy_n(all.begin() + t * b.out_stride, c.num_heads * D, got.begin() + t * c.num_heads * D);
    for (int64_t e = c.num_heads * D; e < b.out_stride; ++e) {
      CHECK_TRUE(all[static_cast<size_t>(t * b.out_stride + e)] == kOutSentinel);
    }
  }
  const std::vector<float> want = Reference(c, b, b.region_f32);
  CHECK_CLOSE(got, want, kKernelAbs, kKernelRel);
  if (f16 && c.vs_unrounded) {
    const std::vector<float> unrounded = Reference(c, b, b.unrounded);
    CHECK_CLOSE(got, unrounded, kHalfAbs, kHalfRel);
  }
}

// Ranges of a decode token at a long context, a decode token at a short one, the first token of a
// sequence (context 1), a prefill chunk after a cached prefix, a prefill chunk from position 0
// and a few tokens after a prefix (speculative decoding's shape).
constexpr SeqRange kLongDecode{3000, 4999, 1, 1};
constexpr SeqRange kShortDecode{1, 60, 1, 1};
constexpr SeqRange kFirstToken{0, 0, 1, 1};
constexpr SeqRange kFewTokens{100, 2000, 2, 4};

AttentionPlanOptions Options(int num_sms = 132, int min_kv_chunk = 256) {
  AttentionPlanOptions o;
  o.num_sms = num_sms;
  o.min_kv_chunk = min_kv_chunk;
  return o;
}
constexpr int kNoSplit = 1 << 30;

// Reference cost: sum over tokens of context * num_heads * head_dim * 2 (kept under ~4e8 a case).
std::vector<AttentionCase> Cases() {
  const auto F32 = KvCacheType::kF32;
  const auto F16 = KvCacheType::kF16;
  // clang-format off
  return {
      // GQA ratio 1 (8 / 8).
      {"mha d64 b16 f32 mixed", 8, 8, 64, 16, F32,
       {kLongDecode, kShortDecode, kFirstToken, {200, 1500, 40, 120}, {0, 0, 20, 100}, kFewTokens},
       Options(), 1, false, false, 1.0f, 0.0f, 101},
      {"mha d128 b32 f16 mixed", 8, 8, 128, 32, F16,
       {kLongDecode, {1, 900, 30, 80}, kFirstToken, kShortDecode, {0, 0, 1, 40}, kFewTokens},
       Options(), 1, false, true, 1.0f, 0.0f, 102},
      // GQA ratio 4 (32 / 8).
      {"gqa4 d128 b16 f32 mixed", 32, 8, 128, 16, F32,
       {kLongDecode, kShortDecode, {1, 300, 20, 48}, kFirstToken, {0, 0, 5, 30}, kFewTokens},
       Options(), 1, false, false, 1.0f, 0.0f, 103},
      {"gqa4 d64 b32 f16 mixed", 32, 8, 64, 32, F16,
       {{1, 500, 10, 40}, kLongDecode, kFewTokens, kShortDecode, {0, 0, 3, 60}, kFirstToken},
       Options(), 1, false, false, 1.0f, 0.0f, 104},
      // GQA ratio 8 (32 / 4).
      {"gqa8 d128 b32 f16 mixed", 32, 4, 128, 32, F16,
       {kShortDecode, kLongDecode, {1, 300, 10, 40}, kFewTokens, kFirstToken, {0, 0, 2, 30}},
       Options(), 1, false, true, 1.0f, 0.0f, 105},
      {"gqa8 d64 b16 f32 mixed", 32, 4, 64, 16, F32,
       {kLongDecode, kLongDecode, {1, 800, 10, 40}, kShortDecode, kFewTokens, {0, 0, 1, 50}},
       Options(), 1, false, false, 1.0f, 0.0f, 106},
      // Decode only: many sequences, contexts from 1 to 5000; a split of the long ones.
      {"gqa8 d128 b16 f16 decode batch", 32, 4, 128, 16, F16,
       {kFirstToken, {4999, 4999, 1, 1}, kShortDecode, kLongDecode, {500, 2000, 1, 1},
        kShortDecode, {31, 33, 1, 1}, kFirstToken},
       Options(), 1, false, false, 1.0f, 0.0f, 107},
      // A long prefill chunk alone: its wide tiles split and merged.
      {"mha d64 b32 f16 long prefix chunk", 8, 8, 64, 32, F16, {{4000, 4900, 20, 60}},
       Options(), 1, false, false, 1.0f, 0.0f, 108},
      // Everything split into many short chunks (32 positions), or nothing split at all.
      {"gqa4 d128 b32 f32 fine split", 32, 8, 128, 32, F32,
       {kShortDecode, {1, 400, 10, 30}, {300, 700, 1, 1}, kFirstToken},
       Options(100000, 32), 1, false, false, 1.0f, 0.0f, 109},
      {"gqa4 d64 b16 f16 no split", 32, 8, 64, 16, F16,
       {kLongDecode, {1, 400, 10, 30}, kShortDecode, kFirstToken},
       Options(132, kNoSplit), 0, false, false, 1.0f, 0.0f, 110},
      // Tokens in random order (a sequence's tokens in several segments), peaked scores (large q)
      // and an explicit scale.
      {"gqa8 d64 b32 f32 shuffled peaked", 32, 4, 64, 32, F32,
       {kLongDecode, {1, 300, 10, 30}, kShortDecode, {0, 0, 5, 20}, kFewTokens},
       Options(), -1, true, false, 6.0f, 0.0f, 111},
      {"mha d128 b16 f16 shuffled scaled", 8, 8, 128, 16, F16,
       {{1, 600, 10, 40}, kLongDecode, kShortDecode, kFewTokens},
       Options(), -1, true, false, 2.0f, 0.3f, 112},
  };
  // clang-format on
}

TANDEM_CHECK_CASE(PagedAttentionMatchesTheReference) {
  for (const AttentionCase& c : Cases()) {
    RunCase(c);
    if (check::CaseFailed()) {
      std::printf("  failed: %s\n", c.what);
      return;
    }
  }
}

TANDEM_CHECK_CASE(PagedAttentionPlanSplitsOnlyWhatIsLong) {
  // One decode token at 5000 and one at 10, 8 KV heads, 132 SMs: the grid aims at 264 blocks,
  // so the long range runs in chunks and the short one whole.
  const std::vector<int32_t> seq = {0, 1}, pos = {4999, 9};
  AttentionPlanInput input;
  input.token_seq = seq.data();
  input.token_pos = pos.data();
  input.num_tokens = 2;
  input.num_heads = 32;
  input.num_kv_heads = 8;
  input.head_dim = 128;
  AttentionPlan plan;
  CHECK_CUDA(PlanAttention(input, AttentionPlanOptions{}, &plan));
  CHECK_TRUE(plan.wide_items.empty());
  CHECK_TRUE(plan.kv_chunk >= 256 && plan.kv_chunk % kAttentionKeysPerTile == 0);
  const int64_t chunks = (5000 + plan.kv_chunk - 1) / plan.kv_chunk;
  CHECK_TRUE(static_cast<int64_t>(plan.narrow_items.size()) == chunks + 1);
  CHECK_TRUE((chunks + 1) * 8 <= 264);
  CHECK_TRUE(plan.narrow_items[0].kv_end - plan.narrow_items[0].kv_begin == plan.kv_chunk);
  CHECK_TRUE(plan.narrow_items.back().kv_end == 10 && plan.narrow_items.back().partial == -1);
  CHECK_TRUE(plan.merge_rows.size() == 4);  // token 0's four heads of each KV head's group
  CHECK_TRUE(plan.partial_rows == chunks * 4);
  // A prompt of 100 tokens (400 rows): seven wide tiles of up to 64 rows.
  std::vector<int32_t> seq2(100, 0), pos2(100);
  std::iota(pos2.begin(), pos2.end(), 0);
  input.token_seq = seq2.data();
  input.token_pos = pos2.data();
  input.num_tokens = 100;
  CHECK_CUDA(PlanAttention(input, AttentionPlanOptions{}, &plan));
  CHECK_TRUE(plan.kv_chunk == 0 && plan.narrow_items.empty() && plan.wide_items.size() == 7);
  CHECK_TRUE(plan.wide_items[0].kv_end == 100);  // longest first: the last tile
}

TANDEM_CHECK_CASE(PagedAttentionRefusesWhatItCannotRun) {
  const std::vector<int32_t> seq = {0}, pos = {0};
  AttentionPlanInput input;
  input.token_seq = seq.data();
  input.token_pos = pos.data();
  input.num_tokens = 1;
  input.num_heads = 8;
  input.num_kv_heads = 8;
  AttentionPlan plan;
  for (int64_t head_dim : {0, 32, 80, 96, 256}) {
    input.head_dim = head_dim;
    CHECK_TRUE(PlanAttention(input, AttentionPlanOptions{}, &plan) == cudaErrorInvalidValue);
  }
  input.head_dim = 64;
  input.num_kv_heads = 3;  // 8 heads are not a multiple of 3
  CHECK_TRUE(PlanAttention(input, AttentionPlanOptions{}, &plan) == cudaErrorInvalidValue);
  input.num_kv_heads = 8;
  const std::vector<int32_t> negative = {-1};
  input.token_pos = negative.data();
  CHECK_TRUE(PlanAttention(input, AttentionPlanOptions{}, &plan) == cudaErrorInvalidValue);
  input.token_pos = pos.data();
  CHECK_CUDA(PlanAttention(input, AttentionPlanOptions{}, &plan));

  DeviceBuffer<float> q(std::vector<float>(64 * 8, 0.5f)), out(64 * 8);
  DeviceBuffer<float> cache(std::vector<float>(16 * 8 * 64 * 2, 0.25f));
  DeviceBuffer<int32_t> table(std::vector<int32_t>{0}), dpos(pos);
  DeviceBuffer<char> workspace(plan.workspace_bytes + 256);
  PagedAttentionParams p;
  p.q = q.get();
  p.q_token_stride = 8 * 64;
  p.out = out.get();
  p.out_token_stride = 8 * 64;
  p.k_cache = cache.get();
  p.v_cache = cache.get() + 16 * 8 * 64;
  p.kv_type = KvCacheType::kF32;
  p.block_stride = 2 * 16 * 8 * 64;
  p.token_stride = 8 * 64;
  p.kv_head_stride = 64;
  p.block_size = 16;
  p.block_tables = table.get();
  p.max_blocks_per_seq = 1;
  p.token_pos = dpos.get();
  p.num_tokens = 1;
  p.num_heads = 8;
  p.num_kv_heads = 8;
  p.head_dim = 64;
  CHECK_CUDA(UploadAttentionPlan(plan, workspace.get(), workspace.size(), nullptr));
  CHECK_CUDA(PagedAttention(p, plan, workspace.get(), workspace.size(), nullptr));
  PagedAttentionParams bad = p;
  bad.head_dim = 96;  // not the plan's, and not supported
  CHECK_TRUE(PagedAttention(bad, plan, workspace.get(), workspace.size(), nullptr) ==
             cudaErrorInvalidValue);
  bad = p;
  bad.num_heads = 16;  // not the plan's
  CHECK_TRUE(PagedAttention(bad, plan, workspace.get(), workspace.size(), nullptr) ==
             cudaErrorInvalidValue);
  bad = p;
  bad.kv_head_stride = 63;  // rows not 16-byte aligned
  CHECK_TRUE(PagedAttention(bad, plan, workspace.get(), workspace.size(), nullptr) ==
             cudaErrorInvalidValue);
  bad = p;
  bad.kv_type = static_cast<KvCacheType>(7);
  CHECK_TRUE(PagedAttention(bad, plan, workspace.get(), workspace.size(), nullptr) ==
             cudaErrorInvalidValue);
  if (plan.workspace_bytes > 0) {
    CHECK_TRUE(PagedAttention(p, plan, workspace.get(), plan.workspace_bytes - 1, nullptr) ==
               cudaErrorInvalidValue);
  }
  CHECK_CUDA(cudaDeviceSynchronize());
}

}  // namespace
}  // namespace tandem::cuda
